# One image for every detq service (workers, migrate, flower, producers).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY detq ./detq
COPY db ./db
COPY dispatch ./dispatch
COPY worker ./worker
COPY producer ./producer
COPY demo ./demo
RUN pip install --no-cache-dir '.[flower]'
ENTRYPOINT []
CMD ["detq", "--help"]
