# Two images from one file:
#   slim    torch-free: producers, `detq scheduler`, `detq db upgrade`, Flower, `detq enqueue` from the host
#   worker  slim + torch and torchvision: `detq worker` (CPU pool; the GPU pool needs a CUDA build of torch)
# Both run as an unprivileged user, with the bundled demo detector as the default model.
FROM python:3.11-slim AS slim
RUN useradd --create-home --uid 10001 detq
WORKDIR /app
COPY pyproject.toml README.md ./
COPY detq ./detq
COPY db ./db
COPY dispatch ./dispatch
COPY worker ./worker
COPY producer ./producer
COPY demo ./demo
RUN pip install --no-cache-dir '.[flower]'
USER detq
ENV DETQ_DATA_DIR=/home/detq/data
CMD ["detq", "--help"]

FROM slim AS worker
USER root
RUN pip install --no-cache-dir '.[worker,flower]'
USER detq
