// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"fmt"
	"strings"
)

// FakeManifest returns a custom-engine manifest that runs the testkit's
// fake engine; extra are more fake-engine arguments (knobs).
func FakeManifest(extra ...string) string {
	args := []string{"serve", "--host", "{{host}}", "--port", "{{port}}", "--served-name", "{{served_name}}"}
	args = append(args, extra...)
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	return fmt.Sprintf(`args        = [%s]
api         = "chat"
health_path = "/health"
key_env     = "FAKE_ENGINE_API_KEY"
version     = "testkit"
stop_grace  = "5s"
idle {
  metrics_path = "/metrics"
  running      = "fake:requests_running"
  waiting      = "fake:requests_waiting"
}
`, strings.Join(quoted, ", "))
}

// AddFakeEngine registers the fake engine as a custom engine through the
// CLI (engine add --custom ... --yes), with extra fake-engine arguments.
func (r *Role) AddFakeEngine(name string, extra ...string) {
	r.t.Helper()
	m := r.WriteFile("manifests/"+name+".hcl", FakeManifest(extra...))
	// On a server of a cluster that is electing, again (not_leader).
	out, errOut, code := r.retryNotLeader("engine", "add", "--custom", r.FakeBin, "--name", name, "--manifest", m, "--yes")
	if code != 0 {
		r.t.Fatalf("engine add %s: exit %d\n%s%s", name, code, out, errOut)
	}
}

// SimpleSpec returns a job spec with one deployment on an engine.
func SimpleSpec(name, engine string) string {
	return fmt.Sprintf(`deployment %q {
  engine = %q
  model {
    path = %q
  }
}
`, name, engine, name)
}

// Deploy writes a spec under the state directory (creating the model
// directories it names under the models root) and runs capyctl deploy.
func (r *Role) Deploy(name, spec string, args ...string) (string, string, int) {
	r.t.Helper()
	r.WriteFile("models/"+name+"/README", "fake model\n")
	f := r.WriteFile("specs/"+name+".hcl", spec)
	return r.CLI(append([]string{"deploy", "--file", f}, args...)...)
}

// MustDeploy deploys and activates a deployment and waits until it is ready.
func (r *Role) MustDeploy(name, spec string) {
	r.t.Helper()
	out, errOut, code := r.Deploy(name, spec, "--activate", "--wait")
	if code != 0 {
		r.t.Fatalf("deploy %s: exit %d\n%s%s\nrole output:\n%s", name, code, out, errOut, r.Output())
	}
}
