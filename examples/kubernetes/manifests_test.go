// Package kubernetes holds no code: its test checks the manifests of this
// folder against package launch and the Dockerfile, so that a manifest a
// user applies as is gives every pod a rank, the world size and rank 0's
// address by the rules comm.InitFromEnv reads them with.
package kubernetes

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/tandemml/tandem/launch"
)

// image is the tag the Dockerfile's build command gives and every manifest
// runs.
const image = "tandem-examples:latest"

// docs decodes every YAML document of a manifest.
func docs(t *testing.T, file string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var out []map[string]any
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if d != nil {
			out = append(out, d)
		}
	}
	return out
}

// kind returns the one document of kind k.
func kind(t *testing.T, ds []map[string]any, k string) map[string]any {
	t.Helper()
	var found map[string]any
	for _, d := range ds {
		if d["kind"] == k {
			if found != nil {
				t.Fatalf("two documents of kind %s", k)
			}
			found = d
		}
	}
	if found == nil {
		t.Fatalf("no document of kind %s", k)
	}
	return found
}

// at walks a decoded document along keys (strings for maps, ints for
// lists) and fails the test when the path is missing.
func at(t *testing.T, v any, path ...any) any {
	t.Helper()
	for i, k := range path {
		switch k := k.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("%v: not a map", path[:i])
			}
			if v, ok = m[k]; !ok {
				t.Fatalf("%v: no key %q", path[:i], k)
			}
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("%v: not a list with an item %d", path[:i], k)
			}
			v = l[k]
		}
	}
	return v
}

func str(t *testing.T, v any, path ...any) string {
	t.Helper()
	s, ok := at(t, v, path...).(string)
	if !ok {
		t.Fatalf("%v: %v is not a string", path, at(t, v, path...))
	}
	return s
}

func num(t *testing.T, v any, path ...any) int {
	t.Helper()
	n, ok := at(t, v, path...).(int)
	if !ok {
		t.Fatalf("%v: %v is not a number", path, at(t, v, path...))
	}
	return n
}

// container checks a pod template's one container (name, image, a program
// the image holds) and returns its environment and its ports by name.
func container(t *testing.T, podTemplate any, name string) (env map[string]string, ports map[string]int) {
	t.Helper()
	cs := at(t, podTemplate, "spec", "containers").([]any)
	if len(cs) != 1 {
		t.Fatalf("%d containers, want 1", len(cs))
	}
	c := cs[0]
	if got := str(t, c, "name"); got != name {
		t.Errorf("container %q, want %q", got, name)
	}
	if got := str(t, c, "image"); got != image {
		t.Errorf("image %q, want %q (the Dockerfile's tag)", got, image)
	}
	prog := str(t, c, "command", 0)
	if _, err := os.Stat(filepath.Join("..", prog, "main.go")); err != nil && prog != "tandem" {
		t.Errorf("command %q is not a program the image holds (an example's folder name, or tandem)", prog)
	}
	env = map[string]string{}
	if e, ok := c.(map[string]any)["env"]; ok {
		for i := range e.([]any) {
			env[str(t, e, i, "name")] = str(t, e, i, "value")
		}
	}
	ports = map[string]int{}
	if p, ok := c.(map[string]any)["ports"]; ok {
		for i := range p.([]any) {
			ports[str(t, p, i, "name")] = num(t, p, i, "containerPort")
		}
	}
	return env, ports
}

// place is where one pod should land.
type place struct {
	launcher          string // launch.Launcher's String
	rank, world       int
	masterAddr        string
	masterPort        int
	localRank, localN int
}

// checkPod reads env as launch does in the pod and compares.
func checkPod(t *testing.T, env map[string]string, want place) {
	t.Helper()
	j, err := launch.From(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err == nil {
		err = j.Resolve(true)
	}
	if err != nil {
		t.Fatalf("pod with %v: %v", env, err)
	}
	got := place{j.Launcher.String(), j.Rank, j.WorldSize, j.MasterAddr, j.MasterPort, j.LocalRank, j.LocalWorldSize}
	if got != want {
		t.Errorf("pod with %v:\n got %+v\nwant %+v", env, got, want)
	}
}

// TestIndexedJob checks indexed-job.yaml: the headless Service names the
// Job's pods, the template sets what Kubernetes leaves out, and each pod
// reads as its completion index of completions ranks, meeting at index 0.
func TestIndexedJob(t *testing.T) {
	ds := docs(t, "indexed-job.yaml")
	svc, job := kind(t, ds, "Service"), kind(t, ds, "Job")
	name := str(t, job, "metadata", "name")
	if got := str(t, svc, "spec", "clusterIP"); got != "None" {
		t.Errorf("Service clusterIP %q: it must be headless (None) to give the pods names", got)
	}
	if got := str(t, svc, "spec", "selector", "job-name"); got != name {
		t.Errorf("Service selects job-name %q, want the Job's name %q", got, name)
	}
	if got := str(t, job, "spec", "completionMode"); got != "Indexed" {
		t.Errorf("completionMode %q, want Indexed (JOB_COMPLETION_INDEX is the rank)", got)
	}
	n := num(t, job, "spec", "completions")
	if p := num(t, job, "spec", "parallelism"); p != n {
		t.Errorf("parallelism %d, want completions (%d): every rank must run at once", p, n)
	}
	tmpl := at(t, job, "spec", "template")
	sub := str(t, tmpl, "spec", "subdomain")
	if sub != str(t, svc, "metadata", "name") {
		t.Errorf("subdomain %q is not the Service's name", sub)
	}
	env, ports := container(t, tmpl, "tandem")
	port := ports["rendezvous"]
	if env["MASTER_PORT"] != strconv.Itoa(port) {
		t.Errorf("MASTER_PORT %q, want the container's rendezvous port %d", env["MASTER_PORT"], port)
	}
	master := fmt.Sprintf("%s-0.%s", name, sub)
	for i := range n {
		pod := map[string]string{"JOB_COMPLETION_INDEX": strconv.Itoa(i), "HOSTNAME": fmt.Sprintf("%s-%d", name, i)}
		for k, v := range env {
			pod[k] = v
		}
		checkPod(t, pod, place{launch.IndexedJob.String(), i, n, master, port, 0, 1})
	}
}

// TestJobSet checks jobset.yaml the same way: JobSet names pod P of job J
// of replicated Job R JOBSET-R-J-P, under a headless Service named after
// the JobSet.
func TestJobSet(t *testing.T) {
	js := kind(t, docs(t, "jobset.yaml"), "JobSet")
	name := str(t, js, "metadata", "name")
	rjobs := at(t, js, "spec", "replicatedJobs").([]any)
	if len(rjobs) != 1 {
		t.Fatalf("%d replicated Jobs, want 1 (ranks are completion indexes)", len(rjobs))
	}
	rj := rjobs[0]
	if r := num(t, rj, "replicas"); r != 1 {
		t.Fatalf("replicas %d, want 1 (ranks are completion indexes)", r)
	}
	job := at(t, rj, "template")
	if got := str(t, job, "spec", "completionMode"); got != "Indexed" {
		t.Errorf("completionMode %q, want Indexed", got)
	}
	n := num(t, job, "spec", "completions")
	if p := num(t, job, "spec", "parallelism"); p != n {
		t.Errorf("parallelism %d, want completions (%d)", p, n)
	}
	env, ports := container(t, at(t, job, "spec", "template"), "tandem")
	port := ports["rendezvous"]
	if env["MASTER_PORT"] != strconv.Itoa(port) {
		t.Errorf("MASTER_PORT %q, want the container's rendezvous port %d", env["MASTER_PORT"], port)
	}
	master := fmt.Sprintf("%s-%s-0-0.%s", name, str(t, rj, "name"), name)
	for i := range n {
		pod := map[string]string{"JOB_COMPLETION_INDEX": strconv.Itoa(i), "HOSTNAME": fmt.Sprintf("%s-%s-0-%d", name, str(t, rj, "name"), i)}
		for k, v := range env {
			pod[k] = v
		}
		checkPod(t, pod, place{launch.IndexedJob.String(), i, n, master, port, 0, 1})
	}
}

// TestPyTorchJob checks pytorchjob.yaml: the container and port carry the
// names the training operator looks for, and the variables the operator
// (v1.7 and later) sets in each pod read as one rank a pod, the Master
// rank 0 and Worker i rank i+1, meeting at the Master's Service.
func TestPyTorchJob(t *testing.T) {
	pj := kind(t, docs(t, "pytorchjob.yaml"), "PyTorchJob")
	name := str(t, pj, "metadata", "name")
	nproc := str(t, pj, "spec", "nprocPerNode")
	if nproc != "1" {
		t.Fatalf("nprocPerNode %q: the program is started directly, one process a pod, so it must be \"1\"", nproc)
	}
	specs := at(t, pj, "spec", "pytorchReplicaSpecs")
	masters, workers := num(t, specs, "Master", "replicas"), num(t, specs, "Worker", "replicas")
	if masters != 1 {
		t.Fatalf("%d Master replicas, want 1: MASTER_ADDR is set only with one", masters)
	}
	_, mports := container(t, at(t, specs, "Master", "template"), "pytorch")
	_, wports := container(t, at(t, specs, "Worker", "template"), "pytorch")
	port, ok := mports["pytorchjob-port"]
	if !ok || wports["pytorchjob-port"] != port {
		t.Fatalf("Master ports %v, Worker ports %v: both need the same pytorchjob-port", mports, wports)
	}
	pods := masters + workers
	for rank := range pods {
		// What the operator writes into the pod.
		env := map[string]string{
			"PYTHONUNBUFFERED": "1",
			"MASTER_ADDR":      name + "-master-0", "PET_MASTER_ADDR": name + "-master-0",
			"MASTER_PORT": strconv.Itoa(port), "PET_MASTER_PORT": strconv.Itoa(port),
			"WORLD_SIZE": strconv.Itoa(pods), "RANK": strconv.Itoa(rank),
			"PET_NNODES": strconv.Itoa(pods), "PET_NODE_RANK": strconv.Itoa(rank), "PET_NPROC_PER_NODE": nproc,
		}
		checkPod(t, env, place{launch.Kubeflow.String(), rank, pods, name + "-master-0", port, 0, 1})
	}
}

// TestDockerfile checks that the image is built with the Go release go.mod
// asks for and tagged as the manifests run it, and that it holds every
// example.
func TestDockerfile(t *testing.T) {
	df, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	if want := "FROM golang:" + string(m[1]) + " AS build"; !bytes.Contains(df, []byte(want)) {
		t.Errorf("the Dockerfile lacks %q (go.mod says go %s)", want, m[1])
	}
	if want := "-t " + image + " ."; !bytes.Contains(df, []byte(want)) {
		t.Errorf("the Dockerfile's build command lacks %q, the tag the manifests run", want)
	}
	if !bytes.Contains(df, []byte("./examples/...")) || !bytes.Contains(df, []byte("./cmd/tandem")) {
		t.Error("the Dockerfile does not build ./examples/... and ./cmd/tandem")
	}
	if !strings.Contains(string(df), "CGO_ENABLED=0") {
		t.Error("the Dockerfile builds with cgo: the runtime stage has no C libraries for it")
	}
}
