# One image for every Strata service; the service is chosen by the container's command
# (`python -m svc_probe`, `python -m svc_generator --tier 1`, ...). See compose.yaml.

# --- build: wheels for the project and its dependencies -------------------------------------------
FROM python:3.11-slim AS build
WORKDIR /src
RUN pip install --no-cache-dir --upgrade pip wheel
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY strata ./strata
COPY svc_probe ./svc_probe
COPY svc_generator ./svc_generator
COPY svc_reward ./svc_reward
COPY svc_scheduler ./svc_scheduler
COPY svc_learner ./svc_learner
ARG STRATA_EXTRAS=""
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".${STRATA_EXTRAS}"

# --- runtime: the installed wheels, nothing else ----------------------------------------------------
FROM python:3.11-slim AS runtime
ENV PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    STRATA_CACHE_DIR=/models \
    STRATA_STATE_DIR=/var/lib/strata
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && useradd --create-home --uid 10001 strata \
    && mkdir -p /models /checkpoints /var/lib/strata && chown strata /models /checkpoints /var/lib/strata
USER strata
WORKDIR /home/strata
# Every service answers the standard gRPC health service; compose overrides the port per service.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s CMD ["strata", "health", "127.0.0.1:50051"]
CMD ["strata", "--help"]
