# Images from one file, all tagged with the release version (pyproject.toml):
#
#   docker build --target cpu -t tandem:0.1.0 .       # extender, scheduler sidecar, queue gate
#   docker build --target gpu -t tandem-gpu:0.1.0 .   # node agent + per-GPU inference servers
#   docker build --target gpu-torch -t tandem-gpu-torch:0.1.0 .   # the same, serving on torch
#
# cpu (the default target): CPU onnxruntime on python:3.11-slim. gpu: the same
# packages with onnxruntime-gpu instead of onnxruntime, on NVIDIA's CUDA 12 runtime
# image with cuDNN 9 (what onnxruntime-gpu < 1.24 is built against; later releases
# need CUDA 13). The NVIDIA container runtime injects the driver (NVML, libcuda), so
# the GPU image needs a driver for CUDA 12 on the node (>= 525). No torch in either:
# the model zoo and profiling run outside the cluster (docs/training.md).
# gpu-torch: the GPU image's variant for the torch executor (--executor=torch
# --device=cuda): CPU onnxruntime as in the cpu image, plus torch from PyPI, whose
# Linux wheels are CUDA builds carrying their own CUDA libraries (the node needs a
# driver recent enough for that CUDA: see docs/deploy.md).
#
# Both run as a non-root user, write nothing outside /tmp, and so suit
# readOnlyRootFilesystem: true (the manifests mount an emptyDir at /tmp).
# tests/deploy/test_dockerfile_replay.py replays the pip steps below without Docker.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
ARG ONNXRUNTIME_GPU="onnxruntime-gpu>=1.20,<1.24"
ARG TORCH_CUDA="torch>=2.4"

# --- cpu build: dependencies first, in their own layer, so code edits do not reinstall them.
FROM ${PYTHON_IMAGE} AS build-cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python3 -m venv /opt/tandem
COPY pyproject.toml README.md LICENSE ./
RUN for p in tandem extender agent planner predictor contracts; do \
      mkdir -p $p && touch $p/__init__.py; done \
 && /opt/tandem/bin/pip install . \
 && /opt/tandem/bin/pip uninstall -y tandem-scheduler
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
 && /opt/tandem/bin/tandem --version

# --- gpu build: the same steps on the CUDA base (its Python 3.12), then the GPU runtime.
FROM ${CUDA_IMAGE} AS build-gpu
ARG ONNXRUNTIME_GPU
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
RUN python3 -m venv /opt/tandem
COPY pyproject.toml README.md LICENSE ./
RUN for p in tandem extender agent planner predictor contracts; do \
      mkdir -p $p && touch $p/__init__.py; done \
 && /opt/tandem/bin/pip install . \
 && /opt/tandem/bin/pip uninstall -y tandem-scheduler
# Both wheels provide the `onnxruntime` module: remove the CPU one first.
RUN /opt/tandem/bin/pip uninstall -y onnxruntime \
 && /opt/tandem/bin/pip install "${ONNXRUNTIME_GPU}"
COPY tandem ./tandem
COPY extender ./extender
COPY agent ./agent
COPY planner ./planner
COPY predictor ./predictor
COPY contracts ./contracts
RUN /opt/tandem/bin/pip install --no-deps . \
 && /opt/tandem/bin/python -m compileall -q /opt/tandem/lib \
 && /opt/tandem/bin/tandem --version \
 && /opt/tandem/bin/python -c "import onnxruntime as o; assert 'CUDAExecutionProvider' in o.get_available_providers()"

# --- gpu-torch build: the cpu packages on the CUDA base, plus a CUDA build of torch.
FROM ${CUDA_IMAGE} AS build-gpu-torch
ARG TORCH_CUDA
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
RUN python3 -m venv /opt/tandem
COPY pyproject.toml README.md LICENSE ./
RUN for p in tandem extender agent planner predictor contracts; do \
      mkdir -p $p && touch $p/__init__.py; done \
 && /opt/tandem/bin/pip install . \
 && /opt/tandem/bin/pip uninstall -y tandem-scheduler
RUN /opt/tandem/bin/pip install "${TORCH_CUDA}"
COPY tandem ./tandem
COPY extender ./extender
COPY agent ./agent
COPY planner ./planner
COPY predictor ./predictor
COPY contracts ./contracts
RUN /opt/tandem/bin/pip install --no-deps . \
 && /opt/tandem/bin/python -m compileall -q /opt/tandem/lib \
 && /opt/tandem/bin/tandem --version \
 && /opt/tandem/bin/python -c "import torch; assert torch.version.cuda, 'torch is a CPU-only build'"

FROM ${CUDA_IMAGE} AS gpu-torch
LABEL org.opencontainers.image.title="tandem-gpu-torch" \
      org.opencontainers.image.description="tandem node agent and per-GPU inference server (CUDA, torch executor)" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 tandem \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin tandem
COPY --from=build-gpu-torch /opt/tandem /opt/tandem
ENV PATH=/opt/tandem/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["tandem"]
CMD ["--help"]

FROM ${CUDA_IMAGE} AS gpu
LABEL org.opencontainers.image.title="tandem-gpu" \
      org.opencontainers.image.description="tandem node agent and per-GPU inference server (CUDA)" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 tandem \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin tandem
COPY --from=build-gpu /opt/tandem /opt/tandem
ENV PATH=/opt/tandem/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["tandem"]
CMD ["--help"]

# The last stage is the default target: the CPU image.
FROM ${PYTHON_IMAGE} AS cpu
LABEL org.opencontainers.image.title="tandem" \
      org.opencontainers.image.description="Kubernetes scheduler extender for GPU co-location" \
      org.opencontainers.image.licenses="Apache-2.0"
# 65532 is the conventional "nonroot" uid/gid; the manifests run with it.
RUN groupadd --gid 65532 tandem \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin tandem
COPY --from=build-cpu /opt/tandem /opt/tandem
ENV PATH=/opt/tandem/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["tandem"]
CMD ["--help"]
