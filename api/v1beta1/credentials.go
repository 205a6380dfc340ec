package v1beta1

import corev1 "k8s.io/api/core/v1"

// CredentialsOf reads a credentials Secret, as every part that serves or
// hands out a BMC's credentials must: ok only when both the user name and
// the password are there and not empty.
func CredentialsOf(secret *corev1.Secret) (username, password string, ok bool) {
	username, password = string(secret.Data[SecretUsernameKey]), string(secret.Data[SecretPasswordKey])
	return username, password, username != "" && password != ""
}
