package controllers

import (
	"crypto/rand"
	"encoding/base32"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtmetal/virtmetal/api/v1beta1"
)

// newCredentialsSecret is a VM's default credentials Secret: a random user
// and password, owned by the VM (not its VirtualMachineBMC), so that a
// deleted and recreated VirtualMachineBMC keeps the credentials MaaS
// already has.
func newCredentialsSecret(vm *kubevirtv1.VirtualMachine) *corev1.Secret {
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: v1beta1.CredentialsSecretName(vm.Name), Namespace: vm.Namespace, Labels: childLabels(vm.Name)},
		Type:       corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			v1beta1.SecretUsernameKey: []byte(newUsername()),
			v1beta1.SecretPasswordKey: []byte(newPassword()),
		},
	}
	setOwner(secret, vmKind, vm, collectedWith)
	return secret
}

// inSharedEntry says whether b's credentials, when it has no Secret
// "<vm>-bmc", are its entry of the Secret sharedName: so they are for a VM
// the shared bmc-server serves that names no Secret of its own. Enrolling
// such a VM then writes no Secret: the entry is written with the others,
// in the shared reconciler's batches. A VM enrolled with a Secret keeps it.
func inSharedEntry(b *v1beta1.VirtualMachineBMC, cfg Config) bool {
	return servedShared(b, cfg) && b.Spec.CredentialsSecret == ""
}

// newUsername returns a random user name: a BMC user name that can be
// guessed lets anyone who reaches IPMI collect password hashes (RAKP), so
// it is never "admin".
func newUsername() string { return "bmc-" + randomToken(10) }

// newPassword returns a password of 20 characters (100 bits), the longest
// that IPMI 2.0 (and ipmitool's -P) carries.
func newPassword() string { return randomToken(20) }

var token = base32.StdEncoding.WithPadding(base32.NoPadding)

// randomToken returns n characters of [a-z2-7], safe in URLs, YAML and
// every BMC client's configuration. IPMI limits user names to 16 bytes and
// passwords to 20: callers keep within those.
func randomToken(n int) string {
	b := make([]byte, (n*5+7)/8)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return strings.ToLower(token.EncodeToString(b))[:n]
}
