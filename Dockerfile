# CPU image by default; CUDA with:  docker build --build-arg BASE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04 \
#                                     --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124 -t prefshift:cuda .
ARG BASE=python:3.11-slim
FROM ${BASE}

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 HF_HOME=/cache/hf

# Not version-pinned: the slim and CUDA bases ship different apt repositories.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends git python3 python3-pip python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && (command -v python >/dev/null || ln -s /usr/bin/python3 /usr/local/bin/python)

WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m pip install --index-url "${TORCH_INDEX}" "torch>=2.4" \
    && python -m pip install .

WORKDIR /work
ENTRYPOINT ["prefshift"]
CMD ["--help"]
