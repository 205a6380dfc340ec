package node

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// source names a Secret or a ConfigMap a volume shows.
type source struct {
	kind string // "Secret" or "ConfigMap"
	types.NamespacedName
}

// sources are the data of the cluster's Secrets and ConfigMaps.
type sources map[source]map[string][]byte

// volume is a Secret or ConfigMap volume as the kubelet lays it out: each
// key a link NAME -> ..data/NAME, ..data a link to a timestamped folder
// that holds the files. A change writes a new folder and swaps ..data in
// one rename, so that a reader sees the old files or the new ones, never a
// mix.
type volume struct {
	source    source
	optional  bool
	dir       string
	mode      os.FileMode
	gid       int // the files' group (the pod's fsGroup); -1: root's
	data      map[string][]byte
	timestamp string // the folder ..data leads to; "" before the first write
}

// volumeOf is the pod's volume name as the stand-in mounts it at dir.
func volumeOf(pod corev1.PodSpec, name, namespace, dir string) (*volume, error) {
	gid := -1
	if pod.SecurityContext != nil && pod.SecurityContext.FSGroup != nil {
		gid = int(*pod.SecurityContext.FSGroup)
	}
	for _, v := range pod.Volumes {
		if v.Name != name {
			continue
		}
		vol := &volume{dir: dir, gid: gid, mode: 0o644}
		var items []corev1.KeyToPath
		switch {
		case v.Secret != nil:
			vol.source = source{kind: "Secret", NamespacedName: types.NamespacedName{Namespace: namespace, Name: v.Secret.SecretName}}
			vol.optional = v.Secret.Optional != nil && *v.Secret.Optional
			items = v.Secret.Items
			if v.Secret.DefaultMode != nil {
				vol.mode = os.FileMode(*v.Secret.DefaultMode)
			}
		case v.ConfigMap != nil:
			vol.source = source{kind: "ConfigMap", NamespacedName: types.NamespacedName{Namespace: namespace, Name: v.ConfigMap.Name}}
			vol.optional = v.ConfigMap.Optional != nil && *v.ConfigMap.Optional
			items = v.ConfigMap.Items
			if v.ConfigMap.DefaultMode != nil {
				vol.mode = os.FileMode(*v.ConfigMap.DefaultMode)
			}
		default:
			return nil, fmt.Errorf("volume %s is neither a Secret nor a ConfigMap; the node stand-in mounts only those", name)
		}
		if len(items) > 0 {
			return nil, fmt.Errorf("volume %s lists items; the node stand-in mounts every key", name)
		}
		return vol, nil
	}
	return nil, fmt.Errorf("no volume %s in the pod", name)
}

// dataOf is what the volume shows of all: its source's data, nothing for
// a missing optional one.
func (v *volume) dataOf(all sources) (map[string][]byte, error) {
	data, ok := all[v.source]
	if !ok && !v.optional {
		return nil, fmt.Errorf("%s %s not found", v.source.kind, v.source.NamespacedName)
	}
	return data, nil
}

// write brings the folder to data, unless it shows data already.
func (v *volume) write(data map[string][]byte) error {
	if v.timestamp != "" && maps.EqualFunc(v.data, data, bytes.Equal) {
		return nil
	}
	if err := os.MkdirAll(v.dir, 0o755); err != nil {
		return err
	}
	timestamp := time.Now().UTC().Format("..2006_01_02_15_04_05.000000000")
	folder := filepath.Join(v.dir, timestamp)
	if err := os.Mkdir(folder, 0o755); err != nil {
		return err
	}
	for name, value := range data {
		path := filepath.Join(folder, name)
		if err := os.WriteFile(path, value, v.mode); err != nil {
			return err
		}
		if err := os.Chmod(path, v.mode); err != nil { // past the umask
			return err
		}
		if v.gid >= 0 {
			if err := os.Lchown(path, 0, v.gid); err != nil {
				return err
			}
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Symlink(timestamp, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		return err
	}
	for name := range data {
		link := filepath.Join(v.dir, name)
		if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				return err
			}
		}
	}
	for name := range v.data {
		if _, ok := data[name]; !ok {
			if err := os.Remove(filepath.Join(v.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	if v.timestamp != "" {
		if err := os.RemoveAll(filepath.Join(v.dir, v.timestamp)); err != nil {
			return err
		}
	}
	v.data, v.timestamp = data, timestamp
	return nil
}
