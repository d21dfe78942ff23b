# sdcguard's images, from this repository (PyPI's `sdcguard` is another project):
#
#   docker build --target scan  -t sdcguard-fleet:0.1.0 .         # the scan node: scanner, report, policy, export
#   docker build --target train -t sdcguard-fleet-train:0.1.0 .   # the same, plus torch (CUDA): training jobs
#
# The tag is the version in pyproject.toml; deploy/kubernetes/*.yaml name the scan image by it. The wheel is built
# once (stage `wheel`, on the runtime's own Python, for its C extensions) and installed by both targets. The scan
# node has no torch: CuPy runs the golden kernels on the CUDA libraries of the base image (NVRTC compiles them),
# nvidia-ml-py finds the GPUs, psycopg reaches a PostgreSQL store (psql sets one up: deploy/kubernetes), kubectl
# runs the `kubernetes-taint` action.
# tests/deploy/test_image.py lints this file (no image registry is reachable where CI runs: docs/scanner.md, "The
# image").

ARG CUDA_BASE=nvidia/cuda:12.6.3-runtime-ubuntu24.04

# ---------------------------------------------------------------------------------------------- the wheel, once
FROM ${CUDA_BASE} AS wheel
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-dev python3-venv gcc \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sdcguard ./sdcguard
COPY fleet_scan ./fleet_scan
COPY kernels ./kernels
COPY golden_vectors ./golden_vectors
RUN python3 -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir "setuptools>=77" wheel \
    && /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

# ------------------------------------------------------------------------------------------------ the scan node
FROM ${CUDA_BASE} AS scan
ARG KUBECTL_VERSION=v1.31.4
# KUBECTL_VERSION empty: no kubectl (a fleet that drains with Slurm or a command of its own)
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv ca-certificates curl postgresql-client \
    && if [ -n "${KUBECTL_VERSION}" ]; then \
        base="https://dl.k8s.io/release/${KUBECTL_VERSION}/bin/linux/amd64" \
        && curl -fsSLo /usr/local/bin/kubectl "${base}/kubectl" && curl -fsSLo /tmp/kubectl.sha256 "${base}/kubectl.sha256" \
        && echo "$(cat /tmp/kubectl.sha256)  /usr/local/bin/kubectl" | sha256sum --check --strict \
        && chmod 0755 /usr/local/bin/kubectl && rm /tmp/kubectl.sha256; \
    fi \
    && apt-get purge -y curl && apt-get autoremove -y && rm -rf /var/lib/apt/lists/*
COPY --from=wheel /wheels /wheels
RUN python3 -m venv /opt/sdcguard \
    && /opt/sdcguard/bin/pip install --no-cache-dir "$(ls /wheels/sdcguard_fleet-*.whl)[gpu,postgres,metrics]" \
    && rm -rf /wheels
ENV PATH=/opt/sdcguard/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    SDCGUARD_DB=/var/lib/sdcguard/sdcguard.db \
    SDCGUARD_LOCK_DIR=/run/sdcguard-locks
RUN useradd --system --uid 10001 --create-home --home-dir /var/lib/sdcguard sdcguard \
    && mkdir -p /run/sdcguard-locks && chown 10001 /run/sdcguard-locks
USER 10001
WORKDIR /var/lib/sdcguard
ENTRYPOINT ["sdcguard"]
CMD ["scan", "--budget", "60s"]

# -------------------------------------------------------------------------------- training jobs: plus torch
FROM scan AS train
USER root
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu126
RUN /opt/sdcguard/bin/pip install --no-cache-dir --index-url "${TORCH_INDEX}" "torch>=2.3,<3"
USER 10001
ENTRYPOINT []
CMD ["python3", "-c", "import sdcguard, torch; print(sdcguard.__version__, torch.__version__)"]
