package check

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const (
	release   = "kv"
	namespace = "llm"
)

// serviceMonitor is the part of prometheus-operator's monitoring.coreos.com/v1 ServiceMonitor
// the chart writes; decoding is strict, so a misspelt field fails.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// manifests is one rendering of the chart, every document decoded strictly into its type.
type manifests struct {
	daemonSets      []appsv1.DaemonSet
	deployments     []appsv1.Deployment
	services        []corev1.Service
	pdbs            []policyv1.PodDisruptionBudget
	serviceAccounts []corev1.ServiceAccount
	configMaps      []corev1.ConfigMap
	serviceMonitors []serviceMonitor
}

func chartDir(t *testing.T) string {
	t.Helper()
	return filepath.Join(repoRoot(t), "deploy", "helm", "kvmesh")
}

// helmTemplate renders the chart with the values files and --set flags given.
func helmTemplate(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	return helmTemplateAs(t, release, args...)
}

// helmTemplateAs is helmTemplate for a release of the given name.
func helmTemplateAs(t *testing.T, name string, args ...string) ([]byte, error) {
	t.Helper()
	helm := tool(t, "helm", "HELM")
	return runErr(chartDir(t), helm, append([]string{"template", name, ".", "--namespace", namespace}, args...)...)
}

func decodeManifests(t *testing.T, out []byte) manifests {
	t.Helper()
	var m manifests
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		if tm.Kind == "" {
			continue // a document of comments only
		}
		var dst any
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 DaemonSet":
			m.daemonSets = append(m.daemonSets, appsv1.DaemonSet{})
			dst = &m.daemonSets[len(m.daemonSets)-1]
		case "apps/v1 Deployment":
			m.deployments = append(m.deployments, appsv1.Deployment{})
			dst = &m.deployments[len(m.deployments)-1]
		case "v1 Service":
			m.services = append(m.services, corev1.Service{})
			dst = &m.services[len(m.services)-1]
		case "policy/v1 PodDisruptionBudget":
			m.pdbs = append(m.pdbs, policyv1.PodDisruptionBudget{})
			dst = &m.pdbs[len(m.pdbs)-1]
		case "v1 ServiceAccount":
			m.serviceAccounts = append(m.serviceAccounts, corev1.ServiceAccount{})
			dst = &m.serviceAccounts[len(m.serviceAccounts)-1]
		case "v1 ConfigMap":
			m.configMaps = append(m.configMaps, corev1.ConfigMap{})
			dst = &m.configMaps[len(m.configMaps)-1]
		case "monitoring.coreos.com/v1 ServiceMonitor":
			m.serviceMonitors = append(m.serviceMonitors, serviceMonitor{})
			dst = &m.serviceMonitors[len(m.serviceMonitors)-1]
		default:
			t.Fatalf("the chart renders a %s %s, which this test does not know", tm.APIVersion, tm.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, dst); err != nil {
			t.Errorf("%s: %v\n%s", tm.Kind, err, doc)
		}
	}
	return m
}

// valueSets are the renderings every invariant is checked on: the defaults and each CI
// values file.
func valueSets(t *testing.T) map[string][]string {
	t.Helper()
	sets := map[string][]string{"defaults": nil}
	files, err := filepath.Glob(filepath.Join(chartDir(t), "ci", "*-values.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no ci/*-values.yaml in the chart: %v", err)
	}
	for _, f := range files {
		sets[filepath.Base(f)] = []string{"-f", f}
	}
	return sets
}

// TestChartLints runs helm lint --strict with each values set, which also checks them
// against values.schema.json.
func TestChartLints(t *testing.T) {
	helm := tool(t, "helm", "HELM")
	for name, args := range valueSets(t) {
		t.Run(name, func(t *testing.T) {
			run(t, chartDir(t), helm, append([]string{"lint", "--strict", "."}, args...)...)
		})
	}
}

// TestChartRendersAMeshOfHardenedNodes decodes every rendering strictly into the Kubernetes
// API types (a field the API does not have fails) and checks what a working, hardened mesh
// needs of it.
func TestChartRendersAMeshOfHardenedNodes(t *testing.T) {
	for name, args := range valueSets(t) {
		t.Run(name, func(t *testing.T) {
			out, err := helmTemplate(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			m := decodeManifests(t, out)
			checkMesh(t, m)
		})
	}
}

func checkMesh(t *testing.T, m manifests) {
	t.Helper()
	var pod corev1.PodTemplateSpec
	switch {
	case len(m.daemonSets) == 1 && len(m.deployments) == 0:
		pod = m.daemonSets[0].Spec.Template
		checkSelects(t, "DaemonSet", m.daemonSets[0].Spec.Selector.MatchLabels, pod.Labels)
	case len(m.deployments) == 1 && len(m.daemonSets) == 0:
		pod = m.deployments[0].Spec.Template
		checkSelects(t, "Deployment", m.deployments[0].Spec.Selector.MatchLabels, pod.Labels)
	default:
		t.Fatalf("%d DaemonSets and %d Deployments; want one workload", len(m.daemonSets), len(m.deployments))
	}
	spec := pod.Spec
	c := container(t, spec.Containers, "kvmesh")
	env := envOf(c)

	// Probes.
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port.String() != "http" {
		t.Errorf("readiness probe %+v; want GET /readyz on port http", p)
	}
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.String() != "http" {
		t.Errorf("liveness probe %+v; want GET /healthz on port http", p)
	}

	// Ports, named as the Services and probes use them.
	want := map[string]corev1.Protocol{"http": corev1.ProtocolTCP, "gossip": corev1.ProtocolTCP, "gossip-udp": corev1.ProtocolUDP, "quic": corev1.ProtocolUDP}
	if env["KVMESH_ADMIN_ADDR"].Value != "" {
		want["admin"] = corev1.ProtocolTCP
	}
	got := map[string]corev1.Protocol{}
	for _, p := range c.Ports {
		got[p.Name] = p.Protocol
	}
	if !maps.Equal(got, want) {
		t.Errorf("container ports %v; want %v", got, want)
	}

	// Hardening.
	for _, ct := range append(slices.Clone(spec.InitContainers), c) {
		sc := ct.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("container %s securityContext %+v; want non-root, read-only root, no escalation, all capabilities dropped", ct.Name, sc)
		}
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the pod mounts a service account token; kvmesh does not call the Kubernetes API")
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("resource requests %v; want cpu and memory", c.Resources.Requests)
	}

	// Draining: the grace period outlasts the preStop pause plus the drain.
	drain, err := time.ParseDuration(env["KVMESH_DRAIN_TIMEOUT"].Value)
	if err != nil {
		t.Fatalf("KVMESH_DRAIN_TIMEOUT: %v", err)
	}
	pause := 0 * time.Second
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Exec != nil {
		cmd := c.Lifecycle.PreStop.Exec.Command
		if d, err := time.ParseDuration(cmd[len(cmd)-1] + "s"); err == nil {
			pause = d
		}
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= drain+pause {
		t.Errorf("terminationGracePeriodSeconds %v; want more than the drain (%v) plus the preStop pause (%v)", g, drain, pause)
	}

	// Secrets: the gossip key from a Secret, never a literal; no ca.key anywhere.
	if e := env["KVMESH_GOSSIP_KEY"]; e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.Value != "" {
		t.Errorf("KVMESH_GOSSIP_KEY %+v; want it from a Secret", e)
	}
	for _, v := range spec.Volumes {
		if v.Secret == nil {
			continue
		}
		for _, it := range v.Secret.Items {
			if strings.Contains(it.Key, "ca.key") {
				t.Errorf("volume %s mounts %s", v.Name, it.Key)
			}
		}
	}
	tlsInit := container(t, spec.InitContainers, "tls")
	if script := strings.Join(tlsInit.Command, " "); !strings.Contains(script, `"$src/ca.key"`) {
		t.Error("the tls init container does not refuse a Secret holding ca.key")
	}
	tlsDir := env["KVMESH_TLS_DIR"].Value
	if !mountsEmptyDir(spec, c, tlsDir) || !mountsEmptyDir(spec, tlsInit, tlsDir) {
		t.Errorf("KVMESH_TLS_DIR %q is not an emptyDir shared by the tls init container and kvmesh", tlsDir)
	}
	if name := env["KVMESH_NAME"]; name.ValueFrom == nil || name.ValueFrom.FieldRef == nil ||
		envOf(tlsInit)["KVMESH_NAME"].ValueFrom.FieldRef.FieldPath != name.ValueFrom.FieldRef.FieldPath {
		t.Errorf("KVMESH_NAME %+v: want the same downward-API field in kvmesh and the tls init container", name)
	}

	// Gossip seeds: the headless Service, publishing pods before they are ready.
	var mesh *corev1.Service
	for i, s := range m.services {
		if s.Spec.ClusterIP == corev1.ClusterIPNone {
			mesh = &m.services[i]
		}
		checkSelects(t, "Service "+s.Name, s.Spec.Selector, pod.Labels)
		for _, p := range s.Spec.Ports {
			if name := p.TargetPort.String(); !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == name && cp.Protocol == p.Protocol }) {
				t.Errorf("Service %s port %s targets %s/%s, which the container does not name", s.Name, p.Name, name, p.Protocol)
			}
		}
	}
	if mesh == nil {
		t.Fatal("no headless Service for the gossip seeds")
	}
	if !mesh.Spec.PublishNotReadyAddresses {
		t.Error("the headless Service leaves out pods that are not ready: a node whose engine loads could not be joined")
	}
	gossipPort := 0
	for _, p := range mesh.Spec.Ports {
		if p.Name == "gossip" {
			gossipPort = int(p.Port)
		}
	}
	if want := fmt.Sprintf("%s.%s.svc.cluster.local:%d", mesh.Name, namespace, gossipPort); env["KVMESH_JOIN"].Value != want {
		t.Errorf("KVMESH_JOIN %q; want %q", env["KVMESH_JOIN"].Value, want)
	}
	if env["KVMESH_ADVERTISE"].Value != "$(POD_IP)" {
		t.Errorf("KVMESH_ADVERTISE %q; want $(POD_IP)", env["KVMESH_ADVERTISE"].Value)
	}

	for _, p := range m.pdbs {
		checkSelects(t, "PodDisruptionBudget", p.Spec.Selector.MatchLabels, pod.Labels)
	}
	// The scrape: /metrics on the port that serves it without a key. The admin listener, when
	// on, does; the API port then never does, and with an API key file it asks one the
	// ServiceMonitor does not send.
	scrape := env["KVMESH_HTTP"].Value
	if admin := env["KVMESH_ADMIN_ADDR"].Value; admin != "" {
		scrape = admin
	} else if env["KVMESH_API_KEYS"].Value != "" && len(m.serviceMonitors) > 0 {
		t.Error("API keys on and no KVMESH_ADMIN_ADDR: the ServiceMonitor's scrapes of the API port get 401")
	}
	for _, sm := range m.serviceMonitors {
		if !labels.SelectorFromSet(sm.Spec.Selector.MatchLabels).Matches(labels.Set(mesh.Labels)) {
			t.Errorf("ServiceMonitor selects %v; the headless Service is labelled %v", sm.Spec.Selector.MatchLabels, mesh.Labels)
		}
		if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Path != "/metrics" {
			t.Fatalf("ServiceMonitor endpoints %+v; want one, of /metrics", sm.Spec.Endpoints)
		}
		if got := servicePortTarget(*mesh, c, sm.Spec.Endpoints[0].Port); fmt.Sprintf(":%d", got) != scrape {
			t.Errorf("ServiceMonitor scrapes port %s, the container's %d; /metrics is served without a key on %s",
				sm.Spec.Endpoints[0].Port, got, scrape)
		}
	}
}

// servicePortTarget is the container port the Service's port of that name reaches, 0 if none.
func servicePortTarget(s corev1.Service, c corev1.Container, name string) int32 {
	for _, sp := range s.Spec.Ports {
		if sp.Name != name {
			continue
		}
		for _, cp := range c.Ports {
			if cp.Name == sp.TargetPort.String() && cp.Protocol == sp.Protocol {
				return cp.ContainerPort
			}
		}
	}
	return 0
}

func checkSelects(t *testing.T, what string, selector, podLabels map[string]string) {
	t.Helper()
	if len(selector) == 0 || !labels.SelectorFromSet(selector).Matches(labels.Set(podLabels)) {
		t.Errorf("%s selects %v; the pods are labelled %v", what, selector, podLabels)
	}
}

func container(t *testing.T, cs []corev1.Container, name string) corev1.Container {
	t.Helper()
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

func envOf(c corev1.Container) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

func mountsEmptyDir(spec corev1.PodSpec, c corev1.Container, path string) bool {
	for _, vm := range c.VolumeMounts {
		if vm.MountPath != path {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == vm.Name && v.EmptyDir != nil {
				return true
			}
		}
	}
	return false
}

// TestChartModes pins what each mode runs: a DaemonSet naming each node after its
// Kubernetes node, or a Deployment of the engine with kvmesh beside it, named after the pod.
func TestChartModes(t *testing.T) {
	out, err := helmTemplate(t)
	if err != nil {
		t.Fatal(err)
	}
	m := decodeManifests(t, out)
	if len(m.daemonSets) != 1 {
		t.Fatalf("default mode renders %d DaemonSets, want 1", len(m.daemonSets))
	}
	pod := m.daemonSets[0].Spec.Template.Spec
	if f := envOf(container(t, pod.Containers, "kvmesh"))["KVMESH_NAME"].ValueFrom.FieldRef.FieldPath; f != "spec.nodeName" {
		t.Errorf("daemonset: KVMESH_NAME from %s, want spec.nodeName", f)
	}
	if pod.NodeSelector["nvidia.com/gpu.present"] != "true" {
		t.Errorf("daemonset: nodeSelector %v; want the GPU nodes", pod.NodeSelector)
	}

	out, err = helmTemplate(t, "-f", filepath.Join(chartDir(t), "ci", "sidecar-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m = decodeManifests(t, out)
	if len(m.deployments) != 1 {
		t.Fatalf("sidecar mode renders %d Deployments, want 1", len(m.deployments))
	}
	pod = m.deployments[0].Spec.Template.Spec
	kv := envOf(container(t, pod.Containers, "kvmesh"))
	container(t, pod.Containers, "vllm")
	if f := kv["KVMESH_NAME"].ValueFrom.FieldRef.FieldPath; f != "metadata.name" {
		t.Errorf("sidecar: KVMESH_NAME from %s, want metadata.name", f)
	}
	if e := kv["KVMESH_ENGINE"].Value; e != "http://127.0.0.1:8000" {
		t.Errorf("sidecar: KVMESH_ENGINE %q, want the engine on loopback", e)
	}
}

// TestChartServesMetricsWithoutAKeyOnTheAdminPort pins the admin listener (--admin-addr): on
// with ports.admin, or at 9090 with API keys (whose API port answers the ServiceMonitor 401),
// in the headless Service the ServiceMonitor scrapes and never in the client Service; the
// probes stay on the API port, where /healthz and /readyz ask no key.
func TestChartServesMetricsWithoutAKeyOnTheAdminPort(t *testing.T) {
	keys := []string{"--set", "node.apiKeys.existingSecret=kvmesh-api-keys"}
	for _, tc := range []struct {
		name string
		args []string
		want string // KVMESH_ADMIN_ADDR
	}{
		{"defaults", nil, ""},
		{"ports.admin", []string{"--set", "ports.admin=9100"}, ":9100"},
		{"api keys", keys, ":9090"},
		{"api keys and ports.admin", append([]string{"--set", "ports.admin=9200"}, keys...), ":9200"},
		{"api keys sidecar", append([]string{"-f", filepath.Join(chartDir(t), "ci", "sidecar-values.yaml")}, keys...), ":9090"},
		{"api keys, no ServiceMonitor", append([]string{"--set", "serviceMonitor.enabled=false"}, keys...), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := helmTemplate(t, append([]string{"--set", "serviceMonitor.enabled=true"}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			m := decodeManifests(t, out)
			checkMesh(t, m) // the ServiceMonitor's port serves /metrics without a key
			var pod corev1.PodSpec
			if len(m.daemonSets) == 1 {
				pod = m.daemonSets[0].Spec.Template.Spec
			} else {
				pod = m.deployments[0].Spec.Template.Spec
			}
			if got := envOf(container(t, pod.Containers, "kvmesh"))["KVMESH_ADMIN_ADDR"].Value; got != tc.want {
				t.Errorf("KVMESH_ADMIN_ADDR %q; want %q", got, tc.want)
			}
			for _, s := range m.services {
				for _, p := range s.Spec.Ports {
					if p.TargetPort.String() == "admin" && s.Spec.ClusterIP != corev1.ClusterIPNone {
						t.Errorf("the client Service %s exposes the admin port, which asks no API key", s.Name)
					}
				}
			}
		})
	}
}

// TestChartRefusesBrokenValues pins the refusals: values the schema forbids, and the checks
// the templates make (a grace period shorter than the drain, sidecar mode without an engine).
func TestChartRefusesBrokenValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown mode", []string{"--set", "mode=statefulset"}, "mode"},
		{"unknown key", []string{"--set", "node.enginekind=vllm"}, "enginekind"},
		{"bad engine kind", []string{"--set", "node.engineKind=triton"}, "engineKind"},
		{"root user", []string{"--set", "securityContext.runAsNonRoot=false"}, "runAsNonRoot"},
		{"short grace", []string{"--set", "terminationGracePeriodSeconds=30"}, "terminationGracePeriodSeconds"},
		{"admin on the sidecar engine's port", []string{"-f", filepath.Join(chartDir(t), "ci", "sidecar-values.yaml"), "--set", "ports.admin=8000"}, "ports.admin"},
		{"grace without the leave", []string{"--set", "terminationGracePeriodSeconds=39"}, "terminationGracePeriodSeconds"},
		{"grace without the drain delay", []string{"--set", "preStopSleepSeconds=0", "--set", "terminationGracePeriodSeconds=36"}, "terminationGracePeriodSeconds"},
		{"sidecar without engine", []string{"--set", "mode=sidecar"}, "sidecar.engine"},
		{"no tls secret", []string{"--set", "tls.existingSecret="}, "existingSecret"},
		{"admin on the http port", []string{"--set", "ports.admin=8080"}, "ports.admin"},
		{"admin on the gossip port", []string{"--set", "node.apiKeys.existingSecret=k", "--set", "serviceMonitor.enabled=true", "--set", "ports.gossip=9090"}, "ports.admin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := helmTemplate(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("helm template %v: err %v; want a refusal naming %q", tc.args, err, tc.want)
			}
		})
	}
}

// TestChartNamesFitKubernetes renders every object of the chart, in both modes, for the longest
// release name Helm takes (53 characters), for a release name with dots (which Helm takes and a
// DNS label does not), and for overrides and an image tag longer than Kubernetes takes, each
// with a "-" or "." where the cut to 63 (58 for the fullname) falls, and
// checks every object's name is a DNS label (63 characters at most, ending in a letter or a
// digit) and every label value and label selector one Kubernetes accepts.
func TestChartNamesFitKubernetes(t *testing.T) {
	long := strings.Repeat("r", 53)
	// The fullname is long + "-" + the name override, cut at 58: after "abc-".
	name := "abc-" + strings.Repeat("n", 58) + "-tail" // cut at 63 after the "-"
	full := strings.Repeat("f", 57) + "-tail"          // cut at 58 after the "-"
	tag := "v1.2.3-" + strings.Repeat("t", 55) + ".suffix"
	all := []string{"--set", "serviceMonitor.enabled=true", "--set-json", `node.config={"node":{"policy":"kvmesh"}}`}
	sidecar := append([]string{"-f", filepath.Join(chartDir(t), "ci", "sidecar-values.yaml")}, all...)
	dotted := "kv.mesh." + strings.Repeat("d", 44) // a "." where the fullname's cut falls
	for _, tc := range []struct {
		name, release string
		args          []string
	}{
		{"release", long, all},
		{"release sidecar", long, sidecar},
		{"dotted release", dotted, all},
		{"dotted release sidecar", "kv.mesh", sidecar},
		{"name override", long, append([]string{"--set", "nameOverride=" + name, "--set", "image.tag=" + tag}, all...)},
		{"fullname override", long, append([]string{"--set", "fullnameOverride=" + full}, sidecar...)},
		{"dotted fullname override", long, append([]string{"--set", "fullnameOverride=kv.mesh"}, all...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := helmTemplateAs(t, tc.release, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			kinds := checkNames(t, out)
			for _, k := range []string{"ServiceAccount", "Service", "PodDisruptionBudget", "ConfigMap", "ServiceMonitor"} {
				if kinds[k] == 0 {
					t.Errorf("no %s rendered: its name went unchecked", k)
				}
			}
		})
	}
}

// checkNames checks the names and label values of every object in out, and returns how many
// objects of each kind it checked.
func checkNames(t *testing.T, out []byte) map[string]int {
	t.Helper()
	kinds := map[string]int{}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return kinds
		}
		if err != nil {
			t.Fatal(err)
		}
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			t.Fatal(err)
		}
		if obj == nil {
			continue // a document of comments only
		}
		kind, _ := obj["kind"].(string)
		kinds[kind]++
		meta, _ := obj["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		for _, msg := range validation.IsDNS1123Label(name) {
			t.Errorf("%s %q: %s", kind, name, msg)
		}
		walkLabels(obj, false, func(key string, value any) {
			v, _ := value.(string)
			for _, msg := range validation.IsValidLabelValue(v) {
				t.Errorf("%s %q: label %s=%q: %s", kind, name, key, v, msg)
			}
		})
	}
}

// walkLabels calls f with each label of v: the maps under "labels" and "matchLabels", and a
// Service's "selector". inLabels says v is such a map.
func walkLabels(v any, inLabels bool, f func(key string, value any)) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			switch {
			case inLabels:
				f(k, e)
			case k == "labels" || k == "matchLabels":
				walkLabels(e, true, f)
			case k == "selector":
				if m, ok := e.(map[string]any); ok && m["matchLabels"] == nil {
					walkLabels(e, true, f) // a Service's selector is its labels
				} else {
					walkLabels(e, false, f)
				}
			default:
				walkLabels(e, false, f)
			}
		}
	case []any:
		for _, e := range v {
			walkLabels(e, false, f)
		}
	}
}
