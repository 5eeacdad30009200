# vLLM with Coda's scheduler installed next to it, for --scheduler-cls; from the repository root:
#   docker build -f deploy/vllm.Dockerfile -t coda-vllm:0.1.0 .
# coda[scheduler] adds only Coda itself to a vLLM 0.32.x environment. Installing it under a
# constraint file of what the image already has makes the build fail, rather than change vLLM's
# packages, should that ever stop being true.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}
COPY pyproject.toml README.md LICENSE /opt/coda-src/
COPY src/ /opt/coda-src/src/
RUN python3 -m pip list --format=freeze > /tmp/vllm-packages.txt \
 && python3 -m pip install --no-cache-dir -c /tmp/vllm-packages.txt '/opt/coda-src[scheduler]' \
 && rm -rf /opt/coda-src /tmp/vllm-packages.txt
