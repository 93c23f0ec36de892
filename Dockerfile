# syntax=docker/dockerfile:1
# The scehr service (and `scehr score`) image: the serve extra and the VARIANT's ONNX Runtime
# extra (`cpu` or `gpu`, pyproject.toml), no torch, non-root.
#
#   docker build -t scehr:gpu .                          # CUDA 13 + cuDNN 9, onnxruntime-gpu
#   docker build -t scehr:cpu --build-arg VARIANT=cpu .  # plain onnxruntime, no CUDA libraries
#
# BASE_IMAGE is the base of the build stage and of the CPU runtime; the GPU runtime is
# CUDA_IMAGE, built on the same Ubuntu release, so the virtual env copied from the build stage
# finds the same Python minor (tests/test_dockerfile.py checks it). Pin either by digest for
# reproducible builds, e.g. --build-arg BASE_IMAGE=ubuntu:24.04@sha256:<digest>.
# scripts/verify_image builds the CPU variant with podman and checks it running.
#
# onnxruntime-gpu==1.31.1 (pinned in pyproject.toml) is built against CUDA 13.0 and loads
# cuDNN 9 (its capi/build_and_package_info.py says cuda_version = '13.0'; its CUDA provider
# links libcudart.so.13 and libcublas.so.13): hence the CUDA 13.0 + cuDNN 9 runtime base, which
# needs an NVIDIA driver >= 580 on the node. tests/test_dockerfile.py checks the majors agree.
#
# Read-only root filesystem: the process writes only under /tmp (TMPDIR: temporary files and the
# private Prometheus multiprocess folder `scehr serve --workers N` creates there); mount an
# emptyDir or tmpfs on /tmp. Default models are baked under /opt/scehr/models (SCEHR_MODEL_DIR);
# mount a volume there to serve others.

ARG VARIANT=gpu
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04
ARG BASE_IMAGE=ubuntu:24.04

# ---------------------------------------------------------------- build: the virtual env
# hadolint ignore=DL3006
FROM ${BASE_IMAGE} AS build
ARG VARIANT
# extra extras, e.g. --build-arg EXTRAS=parquet for Parquet input to `scehr score`
ARG EXTRAS=""
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv
WORKDIR /src
# only what the service needs: the contract (schemas) and the service; training never enters
COPY pyproject.toml setup.py README.md ./
COPY scehr scehr
COPY schemas schemas
COPY service service
# VARIANT names the runtime extra: `cpu` (plain onnxruntime) or `gpu` (onnxruntime-gpu)
RUN case "$VARIANT" in cpu|gpu) ;; *) echo "VARIANT must be cpu or gpu" >&2; exit 1 ;; esac \
    && /opt/venv/bin/pip install --no-compile ".[serve,${VARIANT}${EXTRAS:+,$EXTRAS}]" \
    && /opt/venv/bin/python -m compileall -q /opt/venv \
    && ! /opt/venv/bin/python -c "import torch" 2>/dev/null

# ---------------------------------------------------------------- runtime bases
# hadolint ignore=DL3006
FROM ${CUDA_IMAGE} AS runtime-gpu
# hadolint ignore=DL3006
FROM ${BASE_IMAGE} AS runtime-cpu

# ---------------------------------------------------------------- runtime
# hadolint ignore=DL3006
FROM runtime-${VARIANT} AS runtime
# the one place the port is set: `scehr serve` listens on SCEHR_PORT, the health check asks it
ARG PORT=8000
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin scehr
COPY --from=build /opt/venv /opt/venv
# the venv's python is a link to the build stage's python3.X: fail the build here, not at start,
# when the runtime base has another Python minor
RUN /opt/venv/bin/python -c "import onnxruntime, scehr.service.app"
COPY --chown=root:root models /opt/scehr/models
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TMPDIR=/tmp \
    HOME=/tmp \
    SCEHR_PORT=${PORT} \
    SCEHR_MODEL_DIR=/opt/scehr/models
WORKDIR /opt/scehr
USER 10001:10001
EXPOSE ${PORT}
# Python, not curl: nothing else to install; /livez answers while models load
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request as u; u.urlopen(f'http://127.0.0.1:{os.environ[\"SCEHR_PORT\"]}/livez', timeout=4)"]
# exec form: scehr (uvicorn) is PID 1 and receives SIGTERM itself, then drains in-flight
# requests (graceful shutdown, 30 s) and exits 0
ENTRYPOINT ["scehr"]
CMD ["serve", "--host", "0.0.0.0"]
