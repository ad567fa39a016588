# Images for compose.yaml: `--target orchestrator` (no libtorch), `--target trainer` (libtorch
# from PyPI torch==2.11.0, as scripts do on a host) and `--target init` (both binaries and
# scripts/init-smoke.sh, for the one-shot set-up service).
FROM rust:1.95-bookworm AS build
# npm: orchestrator/build.rs installs the dashboard's chart library from the npm registry.
RUN apt-get update && apt-get install -y --no-install-recommends nodejs npm && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release -p orchestrator

FROM debian:bookworm-slim AS orchestrator
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/orchestrator /usr/local/bin/orchestrator
# Presets name their inputs relative to the working directory (runs/smoke/...: the ./runs mount).
WORKDIR /
ENTRYPOINT ["orchestrator"]

FROM rust:1.95-bookworm AS trainer-build
# TRAINER_FEATURES=nccl (compose's gpu-multi profile) builds the NCCL process groups and vLLM's
# NCCL weight-transfer route, against the CUDA headers of scripts/requirements-cuda.txt.
ARG TRAINER_FEATURES=""
RUN apt-get update && apt-get install -y --no-install-recommends python3-venv && rm -rf /var/lib/apt/lists/*
COPY scripts/requirements-cuda.txt /tmp/requirements-cuda.txt
RUN python3 -m venv /opt/torch && /opt/torch/bin/pip install --no-cache-dir torch==2.11.0 \
    && if [ -n "$TRAINER_FEATURES" ]; then \
         /opt/torch/bin/pip install --no-cache-dir -r /tmp/requirements-cuda.txt; fi
ENV LIBTORCH_USE_PYTORCH=1 PATH=/opt/torch/bin:$PATH
WORKDIR /src
COPY . .
RUN cargo build --release -p trainer ${TRAINER_FEATURES:+--features "$TRAINER_FEATURES"}

FROM debian:bookworm-slim AS trainer
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates python3 && rm -rf /var/lib/apt/lists/*
COPY --from=trainer-build /opt/torch /opt/torch
COPY --from=trainer-build /src/target/release/trainer /usr/local/bin/trainer
ENV LD_LIBRARY_PATH=/opt/torch/lib/python3.11/site-packages/torch/lib
ENTRYPOINT ["trainer"]

FROM trainer AS init
COPY --from=build /src/target/release/orchestrator /usr/local/bin/orchestrator
COPY scripts/init-smoke.sh /opt/rubricem/scripts/init-smoke.sh
COPY scripts/tokenizer-corpus.py /opt/rubricem/scripts/tokenizer-corpus.py
COPY scripts/split-tasks-by-lineage.py /opt/rubricem/scripts/split-tasks-by-lineage.py
COPY scripts/world_tasks.py /opt/rubricem/scripts/world_tasks.py
COPY trainer/configs/small.json /opt/rubricem/trainer/configs/small.json
WORKDIR /
ENTRYPOINT ["/opt/rubricem/scripts/init-smoke.sh"]
