# syntax=docker/dockerfile:1
# The scehr service (and `scehr score`) image: serve extra only, no torch, non-root.
#
#   docker build -t scehr:gpu .                          # CUDA 13 + cuDNN 9, onnxruntime-gpu
#   docker build -t scehr:cpu --build-arg VARIANT=cpu .  # plain onnxruntime, no CUDA libraries
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
ARG CPU_IMAGE=ubuntu:24.04

# ---------------------------------------------------------------- build: the virtual env
FROM ubuntu:24.04 AS build
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
COPY pyproject.toml README.md scehr_cli.py ./
COPY schemas schemas
COPY service service
RUN extra=$([ "$VARIANT" = cpu ] && echo serve-cpu || echo serve) \
    && /opt/venv/bin/pip install --no-compile ".[${extra}${EXTRAS:+,$EXTRAS}]" \
    && /opt/venv/bin/python -m compileall -q /opt/venv \
    && ! /opt/venv/bin/python -c "import torch" 2>/dev/null

# ---------------------------------------------------------------- runtime bases
FROM ${CUDA_IMAGE} AS runtime-gpu
FROM ${CPU_IMAGE} AS runtime-cpu

# ---------------------------------------------------------------- runtime
# hadolint ignore=DL3006
FROM runtime-${VARIANT} AS runtime
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin scehr
COPY --from=build /opt/venv /opt/venv
COPY --chown=root:root models /opt/scehr/models
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TMPDIR=/tmp \
    SCEHR_MODEL_DIR=/opt/scehr/models
WORKDIR /opt/scehr
USER 10001:10001
EXPOSE 8000
# Python, not curl: nothing else to install; /livez answers while models load
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/livez', timeout=4)"]
# exec form: scehr (uvicorn) is PID 1 and receives SIGTERM itself, then drains in-flight
# requests (graceful shutdown, 30 s) and exits 0
ENTRYPOINT ["scehr"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
