// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/gpu"
	"github.com/capyctl/capyctl/core/structs"
)

// Tests written against the mutants make mutate found alive in this
// package (website/content/operations/mutation-testing.md).

// TestNew_Defaults: a role gives the placer no host file system and no
// sample interval: it reads the real /proc and samples every 200 ms; what
// it is given it keeps.
func TestNew_Defaults(t *testing.T) {
	p, err := New(Config{Host: "hostA"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.cfg.HostFS != gpu.DefaultHostFS || p.cfg.SampleInterval != 200*time.Millisecond {
		t.Fatalf("defaults: host fs %+v, sample interval %s", p.cfg.HostFS, p.cfg.SampleInterval)
	}
	fs := gpu.HostFS{ProcRoot: "/proc", CgroupRoot: t.TempDir()}
	q, err := New(Config{Host: "hostA", HostFS: fs, SampleInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if q.cfg.HostFS != fs || q.cfg.SampleInterval != 5*time.Millisecond {
		t.Fatalf("given: host fs %+v, sample interval %s", q.cfg.HostFS, q.cfg.SampleInterval)
	}
}

// TestPlacer_SizingInputResidency: the effective residency the caller
// gives wins over the spec's; the spec's fills in when none is given.
func TestPlacer_SizingInputResidency(t *testing.T) {
	p, err := New(Config{Host: "hostA"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	spec := &structs.Deployment{Name: "d", Residency: structs.ResidencyRestartOnly}
	if in := p.sizingInput(spec, nil, structs.ResidencyDeep, nil); in.Residency != structs.ResidencyDeep {
		t.Fatalf("residency %q, want the effective %q", in.Residency, structs.ResidencyDeep)
	}
	if in := p.sizingInput(spec, nil, "", nil); in.Residency != structs.ResidencyRestartOnly {
		t.Fatalf("residency %q, want the spec's %q", in.Residency, structs.ResidencyRestartOnly)
	}
}
