# EPP: the endpoint picker (Envoy ext_proc on 9002, gRPC health on 9003, Prometheus on 9090, optional OpenAI
# gateway with --http-port). In Kubernetes, run it beside Envoy (or an Envoy-based Gateway) and point it at an
# InferencePool:
#
#   docker build -t epp .
#   docker run epp --pool-name my-pool --pool-namespace llm            # in-cluster service account
#   docker run -v $PWD/endpoints.yaml:/etc/epp/endpoints.yaml epp --endpoints /etc/epp/endpoints.yaml
#
# Arguments are those of `epp serve` (see README.md), which also takes the reference EPP's flags, so the image can
# replace the reference's in its Helm chart unchanged (its --config-file wins over the --config below). The
# default profile is the reference's.
#
# Build arguments, for builders without Docker Hub or PyPI (`python -m bench.image` sets both):
#   BASE_IMAGE  any Debian-like image with python3.11 and its venv module (default python:3.11-slim; Debian
#               bookworm's python3 + python3-venv work too). Both stages use it: the venv points at its python3.
#   EXTRAS      the package extras installed (default fast: uvloop). fast,tokenizer adds the token producer's
#               local backend (tokenizers, jinja2 and what they pull in: 349 MB against 306 MB on the Debian base,
#               2026-11-28); mount the model's tokenizer files and point `local.tokenizer` at them.
#   a wheelhouse: when the build's RUN steps see wheels in /wheels (e.g. `buildah bud --volume DIR:/wheels`),
#               EPP and its dependencies are installed from them only (--no-index); otherwise from this source
#               tree and PyPI.
# The image writes nowhere but /tmp (the self-signed ext_proc certificate is made in memory; the ssl module's
# temporary key files go to /tmp), so it runs with a read-only root filesystem and an emptyDir on /tmp.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ARG EXTRAS=fast
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY epp epp
COPY plugins plugins
# Only the simulator (installed as epp_sim) is part of the package; the benchmarks stay out of the image.
COPY bench/sim bench/sim
# A venv works on both bases (Debian's python3 has no pip outside one). pip and setuptools are removed from it
# afterwards: nothing at run time needs them.
RUN python3 -m venv /opt/epp \
    && if ls /wheels/*.whl >/dev/null 2>&1; then \
         /opt/epp/bin/pip install --no-cache-dir --no-index --find-links /wheels "epp[${EXTRAS}]"; \
       else \
         /opt/epp/bin/pip install --no-cache-dir ".[${EXTRAS}]"; \
       fi \
    && /opt/epp/bin/pip uninstall --yes --quiet pip setuptools

FROM ${BASE_IMAGE}
COPY --from=build /opt/epp /opt/epp
COPY config /etc/epp/config
ENV PATH=/opt/epp/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# An unprivileged user, as the reference's distroless image runs.
USER 65532:65532
EXPOSE 9002 9003 9090
ENTRYPOINT ["epp", "serve", "--config", "/etc/epp/config/default.yaml"]
