# One Dockerfile for virtmetal's three commands, one target each:
#   docker build --target bmc-server     -t virtmetal/bmc-server:v0.1.0 .
#   docker build --target bmc-controller -t virtmetal/bmc-controller:v0.1.0 .
#   docker build --target reconciler     -t virtmetal/reconciler:v0.1.0 .
# `make images` builds all three with the names and tag deploy/ uses.
# The binaries are static (no libc), so the images are scratch plus the CA
# bundle (the reconciler may reach MaaS over HTTPS), running as an
# unprivileged numeric user that needs no /etc/passwd. deploy/'s TestImages
# builds the binaries with this file's go build line and environment and runs
# them as that user in a read-only folder.
ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV CGO_ENABLED=0 GOOS=linux
RUN go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/bmc-server ./cmd/bmc-controller ./cmd/reconciler

FROM scratch AS base
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
USER 65532:65532

FROM base AS bmc-server
COPY --from=build /out/bmc-server /bmc-server
ENTRYPOINT ["/bmc-server"]

FROM base AS bmc-controller
COPY --from=build /out/bmc-controller /bmc-controller
ENTRYPOINT ["/bmc-controller"]

FROM base AS reconciler
COPY --from=build /out/reconciler /reconciler
ENTRYPOINT ["/reconciler"]
