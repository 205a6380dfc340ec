package vmidentity

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	controllermanifests "github.com/virtmetal/virtmetal/deploy/controller"
	"github.com/virtmetal/virtmetal/internal/kubetest"
)

// The package's one API server, with a manager serving the webhooks,
// started by the first envtest test (unit tests and fuzz workers need
// none) and stopped by TestMain.
var (
	suiteOnce sync.Once
	suite     *webhookSuite
	suiteErr  error
	stopSuite = func() {}
)

// enabledKey labels the namespaces the test's EnrolledFunc selects.
const enabledKey = "virtmetal.io/enabled"

type webhookSuite struct {
	env *kubetest.Env
	// cache is the manager's cache the Stamper reads.
	cache client.Reader
}

func TestMain(m *testing.M) {
	code := m.Run()
	stopSuite()
	os.Exit(code)
}

func sharedSuite(t *testing.T) *webhookSuite {
	t.Helper()
	suiteOnce.Do(func() { suite, suiteErr = startSuite() })
	if suiteErr != nil {
		t.Fatalf("envtest: %v", suiteErr)
	}
	return suite
}

func startSuite() (*webhookSuite, error) {
	ctrl.SetLogger(logr.Discard())
	dir, err := os.MkdirTemp("", "vmidentity-webhooks")
	if err != nil {
		return nil, err
	}
	if err := controllermanifests.WriteWebhooks(dir); err != nil {
		return nil, err
	}
	env, err := kubetest.Start(kubetest.Options{WebhookPaths: []string{dir}})
	if err != nil {
		return nil, err
	}
	hook := env.Webhook()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:  env.Client.Scheme(),
		Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: hook.LocalServingHost, Port: hook.LocalServingPort, CertDir: hook.LocalServingCertDir,
		}),
	})
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := SetupIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		cancel()
		_ = env.Stop()
		return nil, err
	}
	macs, err := ParseMACRange(testRange)
	if err != nil {
		cancel()
		_ = env.Stop()
		return nil, err
	}
	cache := mgr.GetCache()
	stamper := &Stamper{Reader: cache, MACs: macs, Enrolled: func(ctx context.Context, vm *kubevirtv1.VirtualMachine) (bool, error) {
		ns := &corev1.Namespace{}
		if err := cache.Get(ctx, client.ObjectKey{Name: vm.Namespace}, ns); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return ns.Labels[enabledKey] == "true" && vm.Annotations["virtmetal.io/bmc"] != "disabled", nil
	}}
	stamper.SetupWebhooks(mgr)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopSuite = func() {
		cancel()
		<-done
		_ = env.Stop()
		_ = os.RemoveAll(dir)
	}
	startCtx, cancelStart := context.WithTimeout(ctx, time.Minute)
	defer cancelStart()
	if !cache.WaitForCacheSync(startCtx) {
		return nil, errors.New("manager cache did not sync")
	}
	// The server is up when it accepts TLS connections.
	err = wait.PollUntilContextCancel(startCtx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		return mgr.GetWebhookServer().StartedChecker()(nil) == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("webhook server did not start: %w", err)
	}
	return &webhookSuite{env: env, cache: cache}, nil
}

// namespace creates a namespace, enrolled or not, and waits until the
// manager's cache has it (the EnrolledFunc reads it there).
func (s *webhookSuite) namespace(t *testing.T, name string, enrolled bool) {
	t.Helper()
	ns := &corev1.Namespace{}
	ns.Name = name
	if enrolled {
		ns.Labels = map[string]string{enabledKey: "true"}
	}
	if err := s.env.Client.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	s.waitCached(t, ns)
}

// waitCached waits until the manager's cache holds obj.
func (s *webhookSuite) waitCached(t *testing.T, obj client.Object) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	into := obj.DeepCopyObject().(client.Object)
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		err := s.cache.Get(ctx, client.ObjectKeyFromObject(obj), into)
		return err == nil, client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatalf("%s never reached the cache: %v", obj.GetName(), err)
	}
}
