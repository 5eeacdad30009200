# coda serve (the gateway) and coda fake-engine: a small non-root image with coda[gateway] only.
#   docker build -t coda:0.1.0 .
#   docker run -p 8080:8080 -v "$PWD/coda.yaml:/etc/coda/coda.yaml:ro" coda:0.1.0
#   docker run -p 8000:8000 -e CODA_HEALTH_URL=http://127.0.0.1:8000/health coda:0.1.0 fake-engine --host 0.0.0.0 --port 8000
# The versions are the development constraints' (constraints/dev.txt), so the image is reproducible.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY constraints/ constraints/
COPY src/ src/
RUN python -m venv /opt/coda \
 && /opt/coda/bin/pip install --no-cache-dir -c constraints/dev.txt '.[gateway]'

FROM python:3.11-slim
COPY --from=build /opt/coda /opt/coda
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin coda
# The gateway listens on every interface here (its own default is loopback): CODA_SERVE_HOST
# overrides the config file's host, and --host overrides both. HEALTHCHECK probes CODA_HEALTH_URL,
# coda serve's /ready by default (some engine is healthy and the gateway is not draining).
ENV PATH=/opt/coda/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CODA_SERVE_HOST=0.0.0.0 \
    CODA_HEALTH_URL=http://127.0.0.1:8080/ready
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['CODA_HEALTH_URL'], timeout=2)"]
ENTRYPOINT ["coda"]
CMD ["serve", "--config", "/etc/coda/coda.yaml"]
