#!/bin/sh
# Make a private CA and the extender's serving certificate with openssl, for
# clusters without cert-manager (docs/deploy.md, step 3 shows both ways).
#
#   manifests/tls/generate-certs.sh [OUT_DIR]        # writes ca.crt, ca.key, tls.crt, tls.key,
#                                                    # scheduler.crt, scheduler.key
#   manifests/tls/generate-certs.sh OUT_DIR --apply  # ... and creates the Secrets and ConfigMap
#
# The certificate names every address the extender is called on: the Service
# (agents), 127.0.0.1 and localhost (the sidecar kube-scheduler), and the admission
# webhook's Service (components/webhook, called by the API server); it stays valid
# for DAYS (default 365). The same CA signs kube-scheduler's client certificate
# (CN tandem-scheduler, Secret tandem-scheduler-client): only a client holding it
# may call the scheduling verbs (mutual TLS, server.tls_client_ca_file).
# Keep ca.key offline; the cluster needs only ca.crt.
set -eu

out="${1:-./tandem-certs}"
apply="${2:-}"
ns="${NAMESPACE:-tandem-system}"
days="${DAYS:-365}"
service="tandem-extender"
webhook="tandem-webhook"

command -v openssl >/dev/null || { echo "openssl not found" >&2; exit 1; }
mkdir -p "$out"
umask 077

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 -days "$days" \
  -subj "/CN=tandem-extender-ca" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null

cat > "$out/server.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:${service},DNS:${service}.${ns},DNS:${service}.${ns}.svc,DNS:${service}.${ns}.svc.cluster.local,DNS:localhost,IP:127.0.0.1,DNS:${webhook}.${ns}.svc,DNS:${webhook}.${ns}.svc.cluster.local
EXT

openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 -subj "/CN=${service}.${ns}.svc" \
  -keyout "$out/tls.key" -out "$out/server.csr" 2>/dev/null
openssl x509 -req -sha256 -days "$days" -in "$out/server.csr" \
  -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -extfile "$out/server.ext" -out "$out/tls.crt" 2>/dev/null
cat > "$out/client.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
EXT
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 -subj "/CN=tandem-scheduler" \
  -keyout "$out/scheduler.key" -out "$out/client.csr" 2>/dev/null
openssl x509 -req -sha256 -days "$days" -in "$out/client.csr" \
  -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -extfile "$out/client.ext" -out "$out/scheduler.crt" 2>/dev/null
rm -f "$out/server.csr" "$out/server.ext" "$out/client.csr" "$out/client.ext" "$out/ca.srl"
chmod 644 "$out/ca.crt" "$out/tls.crt" "$out/scheduler.crt"
echo "wrote $out/ca.crt $out/tls.crt $out/tls.key $out/scheduler.crt $out/scheduler.key (CA key: $out/ca.key)"

if [ "$apply" = "--apply" ]; then
  kubectl -n "$ns" create secret generic tandem-extender-tls \
    --from-file=tls.crt="$out/tls.crt" --from-file=tls.key="$out/tls.key" \
    --from-file=ca.crt="$out/ca.crt" --dry-run=client -o yaml | kubectl apply -f -
  kubectl -n "$ns" create secret generic tandem-scheduler-client \
    --from-file=tls.crt="$out/scheduler.crt" --from-file=tls.key="$out/scheduler.key" \
    --from-file=ca.crt="$out/ca.crt" --dry-run=client -o yaml | kubectl apply -f -
  kubectl -n "$ns" create configmap tandem-extender-ca \
    --from-file=ca.crt="$out/ca.crt" --dry-run=client -o yaml | kubectl apply -f -
  # The admission webhook (components/webhook), when installed, trusts the same CA.
  if kubectl get mutatingwebhookconfiguration tandem-webhook >/dev/null 2>&1; then
    kubectl patch mutatingwebhookconfiguration tandem-webhook --type=json -p \
      "[{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"$(base64 < "$out/ca.crt" | tr -d '\n')\"}]"
  fi
fi
