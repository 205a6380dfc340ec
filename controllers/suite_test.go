package controllers_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"github.com/virtmetal/virtmetal/controllers"
	"github.com/virtmetal/virtmetal/controllers/vmidentity"
	"github.com/virtmetal/virtmetal/internal/kubetest"
)

// The suite shares one API server. Its manager runs as the controller's
// generated ClusterRole, never as an admin, so a missing permission fails a
// test here before it fails in a cluster.
var (
	env *kubetest.Env
	// admin is the test's own client, with every permission.
	admin client.Client
	// controllerConfig authenticates as the user bound to the generated
	// ClusterRole.
	controllerConfig *rest.Config
)

const (
	testDomain      = "bmc.example.test"
	testImage       = "virtmetal/bmc-server:test"
	configNamespace = "virtmetal-system"
	configName      = "virtmetal-config"
	controllerUser  = "virtmetal-controller-test"
	preexistingNS   = "preexisting"
	enabledLabelKey = "virtmetal.io/enabled"
)

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	// VIRTMETAL_TEST_LOGS=1 shows the manager's logs.
	if os.Getenv("VIRTMETAL_TEST_LOGS") != "" {
		ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true)))
	} else {
		ctrl.SetLogger(logr.Discard())
	}
	var err error
	env, err = kubetest.Start(kubetest.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	admin = env.Client
	if controllerConfig, err = bindGeneratedRole(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// A VM that exists before the controller does.
	ctx := context.Background()
	if err := createNamespace(ctx, preexistingNS, true); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := admin.Create(ctx, newVM(preexistingNS, "old")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := createNamespace(ctx, configNamespace, false); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	stopSharedManager()
	return code
}

// bindGeneratedRole installs deploy/controller/rbac/role.yaml and binds it
// to the controller's test user.
func bindGeneratedRole(ctx context.Context) (*rest.Config, error) {
	data, err := os.ReadFile("../deploy/controller/rbac/role.yaml")
	if err != nil {
		return nil, err
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.UnmarshalStrict(data, role); err != nil {
		return nil, err
	}
	if err := admin.Create(ctx, role); err != nil {
		return nil, err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: controllerUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: controllerUser}},
	}
	if err := admin.Create(ctx, binding); err != nil {
		return nil, err
	}
	return env.ConfigFor(controllerUser)
}

var testMACs = func() vmidentity.MACRange {
	r, err := vmidentity.ParseMACRange("02:00:00:00:00:00-02:00:00:ff:ff:ff")
	if err != nil {
		panic(err)
	}
	return r
}()

func defaultConfig() controllers.Config {
	return controllers.Config{
		Domain:            testDomain,
		NamespaceSelector: labels.SelectorFromSet(labels.Set{enabledLabelKey: "true"}),
		IngressClass:      "nginx",
		BMCImage:          testImage,
	}
}

// startManager runs a manager as the controller's user until the returned
// stop is called.
func startManager(cfg *rest.Config, config controllers.Config, concurrency int) (stop func(), err error) {
	configMap := types.NamespacedName{Namespace: configNamespace, Name: configName}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  admin.Scheme(),
		Cache:   controllers.CacheOptions(configMap),
		Metrics: metricsserver.Options{BindAddress: "0"},
		// Several managers run one after another in this process.
		Controller: ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return nil, err
	}
	source := &controllers.ConfigSource{Defaults: config, ConfigMap: configMap, Reader: mgr.GetClient()}
	stamper := &vmidentity.Stamper{Reader: mgr.GetClient(), MACs: testMACs}
	if err := vmidentity.SetupIndexes(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return nil, err
	}
	enrolment, err := controllers.Setup(mgr, controllers.Options{
		Config: source, Identity: stamper, MaxConcurrentReconciles: concurrency,
		// A user's Secret changing shows within a test's patience.
		SharedResync: 2 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	stamper.Enrolled = enrolment.Enrolled
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}, nil
}

var shared struct {
	once sync.Once
	stop func()
	err  error
}

// sharedManager starts the suite's manager on first use: tests share it,
// the benchmark runs its own.
func sharedManager(t testing.TB) {
	t.Helper()
	shared.once.Do(func() {
		shared.stop, shared.err = startManager(controllerConfig, defaultConfig(), 4)
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
}

func stopSharedManager() {
	if shared.stop != nil {
		shared.stop()
		shared.stop = nil
	}
}

func createNamespace(ctx context.Context, name string, enabled bool) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if enabled {
		ns.Labels = map[string]string{enabledLabelKey: "true"}
	}
	return admin.Create(ctx, ns)
}

// namespace creates a namespace for one test.
func namespace(t *testing.T, name string, enabled bool) string {
	t.Helper()
	if err := createNamespace(context.Background(), name, enabled); err != nil {
		t.Fatal(err)
	}
	return name
}

func newVM(namespace, name string) *kubevirtv1.VirtualMachine {
	halted := kubevirtv1.RunStrategyHalted
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &halted,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				Spec: kubevirtv1.VirtualMachineInstanceSpec{
					Domain: kubevirtv1.DomainSpec{
						Devices: kubevirtv1.Devices{
							Interfaces: []kubevirtv1.Interface{{
								Name:                   "pxe",
								InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
							}},
						},
					},
					Networks: []kubevirtv1.Network{{Name: "pxe", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
				},
			},
		},
	}
}

func createVM(t *testing.T, vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachine {
	t.Helper()
	if err := admin.Create(context.Background(), vm); err != nil {
		t.Fatal(err)
	}
	return vm
}

// get reads obj by key and fails the check when it is missing.
func get(key types.NamespacedName, obj client.Object) error {
	return admin.Get(context.Background(), key, obj)
}

// gone is nil once key no longer exists.
func gone(key types.NamespacedName, obj client.Object) error {
	err := admin.Get(context.Background(), key, obj)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err == nil {
		return fmt.Errorf("%T %s still exists", obj, key)
	}
	return err
}
