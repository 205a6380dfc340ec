# make images: the container images of deploy/ (hack/images.sh: static
#              binaries by the local Go, copied into scratch images by podman,
#              else docker). CONTAINER_ENGINE chooses, flags allowed:
#              CONTAINER_ENGINE=docker, or "podman --storage-driver vfs"
#              where overlay mounts fail (inside a container, say).
# make test:   every test, as CI runs them (hack/test.sh).
# IMAGE_PREFIX and IMAGE_TAG must match deploy/kustomization.yaml's images
# list (deploy/'s TestImagesAgree checks they do). IMAGE_TAG is also the
# version the binaries are stamped with: bmc-controller's default
# --bmc-image is virtmetal/bmc-server:IMAGE_TAG.
IMAGE_PREFIX ?= virtmetal
IMAGE_TAG ?= v0.1.0
CONTAINER_ENGINE ?=
IMAGES := bmc-server bmc-controller reconciler

.PHONY: images test generate

images:
	IMAGE_PREFIX='$(IMAGE_PREFIX)' IMAGE_TAG='$(IMAGE_TAG)' IMAGES='$(IMAGES)' \
		CONTAINER_ENGINE='$(CONTAINER_ENGINE)' ./hack/images.sh

test:
	./hack/test.sh

generate:
	./hack/generate.sh
