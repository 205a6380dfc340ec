package kubevirt

import (
	"encoding/json"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
)

// The backend decodes the API server's JSON with encoding/json rather than
// apimachinery's sigs.k8s.io/json. Each keeps a cache of field lists for
// every struct type reachable from a type it decodes, built on first use
// and kept for the life of the process; KubeVirt's
// VirtualMachineInstanceSpec decodes itself with encoding/json, and every
// encode uses it, so with apimachinery's decoder the VM's type graph was
// cached twice. One decoder takes about 1 MB off a BMC pod's memory once
// started (docs/benchmarks.md).
//
// encoding/json also takes a key that differs from a field's name only in
// case. The API server prunes these kinds to their schemas, so such a key
// can reach the decoder only where KubeVirt's schema keeps unknown fields
// (a template's metadata, the clock), written by whoever may write the VM
// itself, and KubeVirt's own VMI spec decoding reads it the same way.

// newCodecs returns the REST clients' serializers for scheme's kinds.
func newCodecs(scheme *runtime.Scheme) runtime.NegotiatedSerializer {
	codecs := serializer.NewCodecFactory(scheme).WithoutConversion()
	infos := append([]runtime.SerializerInfo(nil), codecs.SupportedMediaTypes()...)
	for i := range infos {
		if infos[i].MediaType != runtime.ContentTypeJSON {
			continue
		}
		infos[i].Serializer = stdlibJSON{Serializer: infos[i].Serializer, scheme: scheme}
		if stream := infos[i].StreamSerializer; stream != nil {
			wrapped := *stream
			wrapped.Serializer = stdlibJSON{Serializer: stream.Serializer, scheme: scheme}
			infos[i].StreamSerializer = &wrapped
		}
	}
	return codecsWithMediaTypes{NegotiatedSerializer: codecs, infos: infos}
}

// codecsWithMediaTypes serves the serializers newCodecs chose, built once:
// client-go asks for them on every response.
type codecsWithMediaTypes struct {
	runtime.NegotiatedSerializer
	infos []runtime.SerializerInfo
}

func (c codecsWithMediaTypes) SupportedMediaTypes() []runtime.SerializerInfo { return c.infos }

// stdlibJSON decodes the scheme's typed kinds with encoding/json, as
// apimachinery's JSON serializer does with its own decoder, and leaves
// everything else (encoding, unknown and unstructured objects) to it.
type stdlibJSON struct {
	runtime.Serializer
	scheme *runtime.Scheme
}

func (s stdlibJSON) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	switch into.(type) {
	case *runtime.Unknown, runtime.Unstructured:
		return s.Serializer.Decode(data, defaults, into)
	}
	gvk, err := kjson.DefaultMetaFactory.Interpret(data)
	if err != nil {
		return nil, nil, err
	}
	if defaults != nil {
		*gvk = withDefaults(*gvk, *defaults)
	}
	if into != nil {
		kinds, _, err := s.scheme.ObjectKinds(into)
		switch {
		case runtime.IsNotRegisteredError(err):
			if err := json.Unmarshal(data, into); err != nil {
				return nil, gvk, err
			}
			return into, gvk, nil
		case err != nil:
			return nil, gvk, err
		}
		*gvk = withDefaults(*gvk, kinds[0])
	}
	if gvk.Kind == "" {
		return nil, gvk, runtime.NewMissingKindErr(string(data))
	}
	if gvk.Version == "" {
		return nil, gvk, runtime.NewMissingVersionErr(string(data))
	}
	obj, err := runtime.UseOrCreateObject(s.scheme, s.scheme, *gvk, into)
	if err != nil {
		return nil, gvk, err
	}
	if err := json.Unmarshal(data, obj); err != nil {
		return nil, gvk, err
	}
	return obj, gvk, nil
}

// withDefaults fills what the object's JSON leaves out of its kind from
// defaults, as apimachinery's JSON serializer does.
func withDefaults(actual, defaults schema.GroupVersionKind) schema.GroupVersionKind {
	if actual.Kind == "" {
		actual.Kind = defaults.Kind
	}
	if actual.Version == "" && actual.Group == "" {
		actual.Group, actual.Version = defaults.Group, defaults.Version
	}
	if actual.Version == "" && actual.Group == defaults.Group {
		actual.Version = defaults.Version
	}
	return actual
}
