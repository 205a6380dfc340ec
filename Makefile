# make images: the container images of deploy/ (needs docker or podman).
# make test:   every test, as CI runs them (hack/test.sh).
# IMAGE_PREFIX and IMAGE_TAG must match deploy/kustomization.yaml's images
# list (deploy/'s TestImages checks they do).
IMAGE_PREFIX ?= virtmetal
IMAGE_TAG ?= v0.1.0
CONTAINER_ENGINE ?= $(shell command -v docker || command -v podman)
IMAGES := bmc-server bmc-controller reconciler

.PHONY: images test generate

images:
ifeq ($(CONTAINER_ENGINE),)
	$(error no container engine: install docker or podman, or set CONTAINER_ENGINE)
endif
	for image in $(IMAGES); do \
		$(CONTAINER_ENGINE) build --target $$image -t $(IMAGE_PREFIX)/$$image:$(IMAGE_TAG) . || exit 1; \
	done

test:
	./hack/test.sh

generate:
	./hack/generate.sh
