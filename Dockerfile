# Two images from one file:
#   slim    torch-free: producers, `detq scheduler`, `detq db upgrade`, Flower, `detq enqueue` from the host
#   worker  slim + torch and torchvision: `detq worker` (CPU pool; the GPU pool needs a CUDA build of torch)
# Both run as an unprivileged user, with the bundled demo detector as the default model.
FROM python:3.11-slim AS slim
RUN useradd --create-home --uid 10001 detq
WORKDIR /app
COPY pyproject.toml README.md ./
COPY cli ./cli
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
# torch in the range the test suite runs (a newer CUDA build can need a newer driver than the host has).
# CPU-only boxes: --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu installs the CPU build
# (its torch wheel about 190 MB, against about 3.2 GB of CUDA wheels with the default build).
ARG TORCH_INDEX_URL=
ARG TORCH_SPEC="torch>=2.14,<2.15 torchvision>=0.29,<0.30"
RUN if [ -n "$TORCH_INDEX_URL" ]; then pip install --no-cache-dir --index-url "$TORCH_INDEX_URL" $TORCH_SPEC; fi \
    && pip install --no-cache-dir '.[worker,flower]' $TORCH_SPEC
USER detq
