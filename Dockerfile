# The tandem image: the extender and the node agent (and the per-GPU inference
# server, which uses onnxruntime). No torch: the model zoo and profiling run
# outside the cluster (docs/training.md). No CUDA either: the NVIDIA container
# runtime injects the driver libraries that NVML and onnxruntime's CUDA
# provider load.
#
#   docker build -t tandem:0.1.0 .
#
# Runs as a non-root user, writes nothing outside /tmp, and so suits
# readOnlyRootFilesystem: true (the manifests mount an emptyDir at /tmp).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/tandem
# Dependencies first, in their own layer, so code edits do not reinstall them.
COPY pyproject.toml README.md ./
RUN for p in tandem extender agent planner predictor contracts; do \
      mkdir -p $p && touch $p/__init__.py; done \
 && /opt/tandem/bin/pip install . \
 && /opt/tandem/bin/pip uninstall -y tandem
COPY tandem ./tandem
COPY extender ./extender
COPY agent ./agent
COPY planner ./planner
COPY predictor ./predictor
COPY contracts ./contracts
# A regular (not editable) install: the packages live in site-packages, with
# their YAML/JSON data files, and the source tree is not needed at run time.
RUN /opt/tandem/bin/pip install --no-deps . \
 && /opt/tandem/bin/python -m compileall -q /opt/tandem/lib \
 && /opt/tandem/bin/tandem --help >/dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="tandem" \
      org.opencontainers.image.description="Kubernetes scheduler extender for GPU co-location" \
      org.opencontainers.image.licenses="Apache-2.0"
# 65532 is the conventional "nonroot" uid/gid; the manifests run with it.
RUN groupadd --gid 65532 tandem \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin tandem
COPY --from=build /opt/tandem /opt/tandem
ENV PATH=/opt/tandem/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["tandem"]
CMD ["--help"]
