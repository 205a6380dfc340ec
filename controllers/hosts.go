package controllers

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtmetal/virtmetal/api/v1beta1"
	"github.com/virtmetal/virtmetal/internal/bmcspec"
)

// indexCustomHost indexes VirtualMachineBMCs by the host their spec asks
// for (lower case), so that a host's claimants are found without reading
// every BMC of a namespace. A BMC without one has its VM's default host,
// which is found by name.
const indexCustomHost = "spec.ingress.host"

func customHost(obj client.Object) []string {
	if h := obj.(*v1beta1.VirtualMachineBMC).Spec.Ingress.Host; h != "" {
		return []string{strings.ToLower(h)}
	}
	return nil
}

// olderClaim orders two BMCs claiming one host: the older keeps it, and
// between two created in the same second the name decides.
func olderClaim(a, b *v1beta1.VirtualMachineBMC) int {
	return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
}

// hostHolder returns the VirtualMachineBMC of b's namespace that keeps host
// when others ask for it too: b itself, or an older one. Two BMCs with one
// host would give MaaS one address for two machines; in shared mode one
// bmc-server could not tell them apart.
func hostHolder(ctx context.Context, c client.Reader, b *v1beta1.VirtualMachineBMC, host, domain string) (*v1beta1.VirtualMachineBMC, error) {
	var claims v1beta1.VirtualMachineBMCList
	if err := c.List(ctx, &claims, client.InNamespace(b.Namespace), client.MatchingFields{indexCustomHost: host}); err != nil {
		return nil, err
	}
	// The BMC named vm has vm's default host unless its spec names another.
	// VM names may have dots ("web1.rack"): all of host before the zone is
	// the name.
	if vm, ok := strings.CutSuffix(host, "."+bmcspec.Zone(b.Namespace, domain)); ok {
		var byDefault v1beta1.VirtualMachineBMC
		err := c.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: vm}, &byDefault)
		switch {
		case err == nil && byDefault.Spec.Ingress.Host == "":
			claims.Items = append(claims.Items, byDefault)
		case err != nil && !apierrors.IsNotFound(err):
			return nil, err
		}
	}
	holder := b
	for i := range claims.Items {
		other := &claims.Items[i]
		if other.Name != b.Name && other.DeletionTimestamp.IsZero() && olderClaim(other, holder) < 0 {
			holder = other
		}
	}
	return holder, nil
}

// hostTaken says that holder, not the BMC asking, keeps host.
func hostTaken(host, holder string) error {
	return fmt.Errorf("%w: host %s is VirtualMachineBMC %s's, which asked for it first", errHostTaken, host, holder)
}
