# One image for every Strata service; the service is chosen by the container's command
# (`python -m svc_probe`, `python -m svc_generator --tier 1`, ...). See compose.yaml.
#
# BASE_IMAGE: any Python 3.11+ image with pip (deploy/images/ builds one from Debian packages for
# hosts that reach no registry). PIP_CERT: a CA bundle mounted into the build (never baked in) for
# hosts behind a TLS-intercepting proxy; deploy/images/build.sh passes both.
ARG BASE_IMAGE=python:3.11-slim

# --- dependencies: wheels of what pyproject.toml requires (a layer kept until it changes) ----------
FROM ${BASE_IMAGE} AS deps
ARG PIP_CERT
ARG STRATA_EXTRAS=""
ARG STRATA_DEPS_HASH=""
WORKDIR /src
RUN pip install --no-cache-dir --upgrade pip wheel
COPY pyproject.toml ./
RUN python -c "import sys, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
extras = [e for e in sys.argv[1].strip('[]').split(',') if e]; \
print('\n'.join(p['dependencies'] + [d for e in extras for d in p['optional-dependencies'][e]]))" \
        "${STRATA_EXTRAS}" > requirements.txt \
    && pip wheel --no-cache-dir --wheel-dir /wheels -r requirements.txt

# --- project: the Strata wheel alone (rebuilt on every source change, in seconds) ---------------------
# (Its own stage, not FROM deps: buildah mounts a stage that is another's base as an empty tree.)
FROM ${BASE_IMAGE} AS project
ARG PIP_CERT
# A hash of the sources (deploy/images/build.sh passes it): podman's layer cache has been seen to
# reuse a stale COPY of changed sources; an ARG that changes with them changes every later key.
ARG STRATA_SOURCE_HASH=""
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY strata ./strata
COPY strata_tools ./strata_tools
COPY svc_probe ./svc_probe
COPY svc_generator ./svc_generator
COPY svc_reward ./svc_reward
COPY svc_scheduler ./svc_scheduler
COPY svc_learner ./svc_learner
COPY svc_annotation ./svc_annotation
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /project .

# --- runtime: the installed wheels, nothing else ----------------------------------------------------
FROM ${BASE_IMAGE} AS runtime
ENV PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    STRATA_CACHE_DIR=/models \
    STRATA_STATE_DIR=/var/lib/strata
# The wheels are mounted from the build stages, not copied: a copied layer would keep their
# gigabytes (torch) in the image even after they are deleted. Dependencies first, so that a source
# change reinstalls only the Strata wheel. A mounted stage's content is not part of a layer's cache
# key, so a hash of pyproject.toml (deploy/images/build.sh passes it) is: a new dependency
# reinstalls them (seen: flask missing from an image built after it was added).
ARG STRATA_DEPS_HASH=""
RUN --mount=type=bind,from=deps,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index /wheels/*.whl \
    && useradd --create-home --uid 10001 strata \
    && mkdir -p /models /checkpoints /var/lib/strata && chown strata /models /checkpoints /var/lib/strata
ARG STRATA_SOURCE_HASH=""
RUN --mount=type=bind,from=project,source=/project,target=/project \
    pip install --no-cache-dir --no-index --no-deps /project/*.whl
USER strata
WORKDIR /home/strata
# Every service answers the standard gRPC health service; compose overrides the port per service.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s CMD ["strata", "health", "127.0.0.1:50051"]
CMD ["strata", "--help"]
