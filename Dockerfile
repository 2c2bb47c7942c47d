# netmon: GPU interconnect monitor. docs/DEPLOY.md has build and run instructions.
#
#   docker build -t netmon:0.1.0 .
#   docker run --rm --runtime nvidia --pid host --shm-size 4g -p 19464:19464 netmon:0.1.0
#
# torch comes from PyPI as a CUDA build that carries its own CUDA runtime and NCCL libraries, so
# the base image is the small CUDA "base" flavour: the NVIDIA container runtime adds the driver.
# TORCH_VERSION and CUDA_IMAGE are pinned together: torch 2.13.0 wheels are built for CUDA 13.0
# (host driver 580 or newer). The base is pinned by digest, so a tag moved on the registry cannot
# change what is built; docs/DEPLOY.md, "Container image", says how to check it and move it.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-base-ubuntu24.04@sha256:f8ef28f579ea42a44b415d2c5d46f788e6a9b395c6c83f2929416e1fc192c143

FROM ${CUDA_IMAGE} AS build
# Distribution packages float with the base image's security updates; pinning them would break
# the build whenever Ubuntu ships a fix.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
ARG TORCH_VERSION=2.13.0
# A CPU-only package index here gives a small image that runs gloo probes only.
ARG TORCH_INDEX_URL=""
RUN python3 -m venv /opt/netmon \
 && /opt/netmon/bin/pip install --no-cache-dir --disable-pip-version-check \
      ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}"
# Every other dependency from a hash-locked file: a wheel whose contents differ from the lock's,
# or a dependency missing from it, fails here. torch has no hashes: its CUDA wheels (and the
# nvidia-* libraries they pull) come from an index chosen at build time (TORCH_INDEX_URL).
COPY deploy/docker/requirements.lock /src/
RUN /opt/netmon/bin/pip install --no-cache-dir --disable-pip-version-check --require-hashes \
      -r /src/requirements.lock
COPY pyproject.toml README.md /src/
COPY netmon /src/netmon
# netmon itself with nothing more: its dependencies are in place, setuptools is the lock's, and
# pip check fails the build if the lock lacks one of them.
RUN /opt/netmon/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps \
      --no-build-isolation /src \
 && /opt/netmon/bin/pip check \
 && /opt/netmon/bin/netmon --help >/dev/null

FROM ${CUDA_IMAGE}
ARG TORCH_VERSION=2.13.0
LABEL org.opencontainers.image.title="netmon" \
      org.opencontainers.image.description="GPU interconnect monitor: NCCL/gloo collective probes on idle GPUs, exported to Prometheus" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.documentation="docs/DEPLOY.md" \
      org.opencontainers.image.base.name="nvidia/cuda" \
      io.netmon.torch.version="${TORCH_VERSION}"
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 netmon \
 && useradd --system --uid 10001 --gid netmon --home-dir /var/lib/netmon \
      --shell /usr/sbin/nologin netmon \
 && install -d -o netmon -g netmon -m 0750 /var/lib/netmon \
 && install -d -o netmon -g netmon -m 0755 /run/netmon
COPY --from=build /opt/netmon /opt/netmon
COPY deploy/docker/netmon.yaml /etc/netmon/netmon.yaml
# The NVIDIA runtime exposes every GPU and the NVML library (utility); netmon probes only the
# GPUs that are idle. The device nodes it injects are world-readable, so NVML and CUDA work for
# the unprivileged user below.
ENV PATH=/opt/netmon/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NETMON_CONFIG=/etc/netmon/netmon.yaml \
    HOME=/var/lib/netmon
USER 10001:10001
WORKDIR /var/lib/netmon
EXPOSE 19464
# No curl in the image: the venv's Python asks /healthz. NETMON_HEALTHCHECK_URL for another port.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ.get('NETMON_HEALTHCHECK_URL', 'http://127.0.0.1:19464/healthz'), timeout=4)"]
ENTRYPOINT ["netmon"]
CMD ["serve"]
