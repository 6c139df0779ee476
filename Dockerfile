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
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY epp epp
COPY plugins plugins
COPY bench bench
RUN pip install --no-cache-dir --prefix=/install '.[fast]'

FROM python:3.11-slim
COPY --from=build /install /usr/local
COPY config /etc/epp/config
# An unprivileged user, as the reference's distroless image runs.
USER 65532:65532
EXPOSE 9002 9003 9090
ENTRYPOINT ["epp", "serve", "--config", "/etc/epp/config/default.yaml"]
