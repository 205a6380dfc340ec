# The images of virtmetal's three commands, one target each. Build them with
# `make images` (hack/images.sh), not by hand: the build context is not this
# folder but the one the script fills (dist/images) with the static binaries,
# built by the local Go, and the host's CA bundle. No stage pulls a base
# image or runs a command, so a build needs neither a registry nor a
# container runtime. Each image is the binary, as an unprivileged numeric
# user that needs no /etc/passwd. deploy/'s TestImages builds them and checks
# what they hold.

# bmc-server verifies the certificates of HTTPS event destinations.
FROM scratch AS bmc-server
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY bmc-server /bmc-server
USER 65532:65532
ENTRYPOINT ["/bmc-server"]

# bmc-controller talks to the API server only, whose CA comes with the
# service account: no CA bundle.
FROM scratch AS bmc-controller
COPY bmc-controller /bmc-controller
USER 65532:65532
ENTRYPOINT ["/bmc-controller"]

# The reconciler may reach MaaS over HTTPS.
FROM scratch AS reconciler
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY reconciler /reconciler
USER 65532:65532
ENTRYPOINT ["/reconciler"]
