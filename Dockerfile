# One image, two targets: `cpu` (torch's CPU build) and `cuda` (torch's CUDA build,
# whose wheels carry the CUDA runtime; the host's NVIDIA container toolkit brings the
# driver). Both run `genfleet api` or `genfleet worker` and hold the default model,
# fetched and converted at build time, so no container downloads a model at start.
#
#   docker build --target cpu -t genfleet:cpu .
#   docker build --target cuda -t genfleet:cuda .

FROM python:3.11.11-slim-bookworm AS base
# g++ builds the CPU kernels (kernels/native) on first use.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    GENFLEET_CACHE_DIR=/opt/genfleet/cache
WORKDIR /opt/genfleet/src
COPY pyproject.toml README.md ./
COPY genfleet genfleet
COPY queue_schemas queue_schemas
COPY kernels kernels
COPY worker worker
COPY producer_api producer_api

FROM base AS cpu
RUN pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu \
    && pip install ".[worker]" \
    && genfleet model fetch
# 8000: the API; 9400: a worker's /metrics, /healthz and /readyz.
EXPOSE 8000 9400
ENTRYPOINT ["genfleet"]
CMD ["worker"]

FROM base AS cuda
RUN pip install "torch==2.13.0" \
    && pip install ".[worker,triton]" \
    && genfleet model fetch
EXPOSE 8000 9400
ENTRYPOINT ["genfleet"]
CMD ["worker"]
