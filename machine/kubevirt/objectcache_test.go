package kubevirt

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// fakeListWatch serves a Reflector the lists it is given, in turn, and a
// watch the test drives. Unless watchList, it tells the Reflector that it
// cannot stream a list (WatchList), so the Reflector lists, then watches.
type fakeListWatch struct {
	watchList bool

	mu      sync.Mutex
	lists   [][]kubevirtv1.VirtualMachine
	watches chan *watch.FakeWatcher
}

func (lw *fakeListWatch) ListWithContext(_ context.Context, _ metav1.ListOptions) (runtime.Object, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	items := lw.lists[0]
	if len(lw.lists) > 1 {
		lw.lists = lw.lists[1:]
	}
	return &kubevirtv1.VirtualMachineList{ListMeta: metav1.ListMeta{ResourceVersion: "10"}, Items: slices.Clone(items)}, nil
}

func (lw *fakeListWatch) WatchWithContext(context.Context, metav1.ListOptions) (watch.Interface, error) {
	w := watch.NewFakeWithChanSize(10, false)
	lw.watches <- w
	return w, nil
}

func (lw *fakeListWatch) List(opts metav1.ListOptions) (runtime.Object, error) {
	return lw.ListWithContext(context.Background(), opts)
}

func (lw *fakeListWatch) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return lw.WatchWithContext(context.Background(), opts)
}

func (lw *fakeListWatch) IsWatchListSemanticsUnSupported() bool { return !lw.watchList }

// change is one delivery of an objectCache.
type change struct {
	name, resourceVersion string
	deleted               bool
}

func cacheVM(name, resourceVersion string) *kubevirtv1.VirtualMachine {
	return &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{
		Namespace: "ns", Name: name, ResourceVersion: resourceVersion,
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
	}}
}

// TestObjectCache: what the Reflector lists and watches is kept, trimmed,
// and told in order, and a list after the watch expired tells of what
// vanished in between as deleted.
func TestObjectCache(t *testing.T) {
	for _, tc := range []struct {
		name      string
		watchList bool
	}{
		{name: "list then watch"},
		{name: "streamed list", watchList: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lw := &fakeListWatch{
				watchList: tc.watchList,
				lists:     [][]kubevirtv1.VirtualMachine{{*cacheVM("a", "5"), *cacheVM("b", "6")}, {*cacheVM("b", "12")}},
				watches:   make(chan *watch.FakeWatcher, 4),
			}
			changes := make(chan change, 16)
			cache := newObjectCache(lw, "virtualmachines", &kubevirtv1.VirtualMachine{}, func(obj any, deleted bool) {
				vm := obj.(*kubevirtv1.VirtualMachine)
				if vm.ManagedFields != nil {
					t.Errorf("%s delivered untrimmed", vm.Name)
				}
				changes <- change{vm.Name, vm.ResourceVersion, deleted}
			})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			go cache.Run(ctx)

			w := <-lw.watches
			if tc.watchList {
				// The API server streams the list as events, then a
				// bookmark that ends it.
				w.Add(cacheVM("a", "5"))
				w.Add(cacheVM("b", "6"))
				w.Action(watch.Bookmark, &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{
					ResourceVersion: "10", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"},
				}})
			}
			// A list is one batch: a streamed one reaches the store in the
			// order of the Reflector's own map.
			expectInAnyOrder(t, changes, change{"a", "5", false}, change{"b", "6", false})
			if !cache.HasSynced() {
				t.Fatal("not synced after the first list")
			}

			w.Add(cacheVM("c", "11"))
			w.Modify(cacheVM("a", "12"))
			w.Delete(cacheVM("c", "13"))
			expect(t, changes, change{"c", "11", false}, change{"a", "12", false}, change{"c", "13", true})
			assertCached(t, cache, map[string]string{"ns/a": "12", "ns/b": "6"})

			if tc.watchList {
				return // the next list would be streamed again; the store is the same
			}
			// The watch expires; the Reflector lists again, where a is gone.
			w.Error(&metav1.Status{Status: metav1.StatusFailure, Code: http.StatusGone, Reason: metav1.StatusReasonExpired})
			<-lw.watches
			expect(t, changes, change{"a", "12", true}, change{"b", "12", false})
			assertCached(t, cache, map[string]string{"ns/b": "12"})
		})
	}
}

func expect(t *testing.T, changes <-chan change, want ...change) {
	t.Helper()
	if got := receive(t, changes, len(want)); !slices.Equal(got, want) {
		t.Fatalf("delivered %+v, want %+v", got, want)
	}
}

func expectInAnyOrder(t *testing.T, changes <-chan change, want ...change) {
	t.Helper()
	got := receive(t, changes, len(want))
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Fatalf("delivered %+v, want %+v in any order", got, want)
		}
	}
}

// receive takes n deliveries, failing when none comes for 10 s.
func receive(t *testing.T, changes <-chan change, n int) []change {
	t.Helper()
	var got []change
	for range n {
		select {
		case c := <-changes:
			got = append(got, c)
		case <-time.After(10 * time.Second):
			t.Fatalf("delivered %+v, then nothing for 10 s; want %d", got, n)
		}
	}
	return got
}

func assertCached(t *testing.T, cache *objectCache, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, obj := range cache.store.List() {
		vm := obj.(*kubevirtv1.VirtualMachine)
		got[vm.Namespace+"/"+vm.Name] = vm.ResourceVersion
	}
	for key, rv := range want {
		if got[key] != rv {
			t.Errorf("cached %s at %q, want %q (cache: %v)", key, got[key], rv, got)
		}
		if _, exists, _ := cache.get(key); !exists {
			t.Errorf("get(%s) finds nothing", key)
		}
	}
	if len(got) != len(want) {
		t.Errorf("cache holds %v, want %v", got, want)
	}
}

// TestRefusedListIsUnreachable: an API server that answers the caches'
// list (streamed, a watch) with an error, here 503, is an outage the
// transport cannot see, as it answered: the subscribed Backend reads
// through to it until a list succeeds.
func TestRefusedListIsUnreachable(t *testing.T) {
	apiServer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"ServiceUnavailable","code":503}`))
	}))
	defer apiServer.Close()
	client, err := rest.RESTClientFor(&rest.Config{
		Host: apiServer.URL, APIPath: "/apis",
		ContentConfig: rest.ContentConfig{
			GroupVersion:         &kubevirtv1.SchemeGroupVersion,
			NegotiatedSerializer: serializer.NewCodecFactory(backendScheme()).WithoutConversion(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	inf := newOwnInformers(client, "ns", "vm", InformersOptions{ProbeInterval: time.Hour})
	b := &Backend{namespace: "ns", vmName: "vm"}
	inf.subscribe(b)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go inf.Run(ctx)
	for deadline := time.Now().Add(10 * time.Second); !b.watchFailing.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a refused list left the Backend reading from a cache that never synced as if the API server answered")
		}
	}
}
