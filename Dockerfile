# One image for every role (migrate, api, worker); the command picks the role.
FROM python:3.11-slim

# CPU torch by default; for GPU workers build with
#   --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 OPD_HOME=/var/lib/opd

WORKDIR /app
RUN pip install --index-url "$TORCH_INDEX" "torch==2.13.0"
COPY pyproject.toml README.md alembic.ini ./
COPY opd ./opd
COPY app ./app
COPY worker ./worker
COPY kernel ./kernel
COPY migrations ./migrations
COPY examples ./examples
RUN pip install -e ".[local,tinker]"

RUN useradd --create-home opd && mkdir -p /var/lib/opd /artifacts /data \
    && chown -R opd /var/lib/opd /artifacts /data
USER opd
EXPOSE 8000
CMD ["opd", "api", "--host", "0.0.0.0", "--port", "8000"]
