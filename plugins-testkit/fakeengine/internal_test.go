// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

func TestParseBytes(t *testing.T) {
	cases := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{in: "0", want: 0},
		{in: "4096", want: 4096},
		{in: "4096B", want: 4096},
		{in: "512MiB", want: 512 << 20},
		{in: "2GiB", want: 2 << 30},
		{in: "1.5GiB", want: 3 << 29},
		{in: " 8G ", want: 8 << 30},
		{in: "1GB", want: 1_000_000_000},
		{in: "", wantErr: true},
		{in: "GiB", wantErr: true},
		{in: "-1GiB", wantErr: true},
		{in: "2 parsecs", wantErr: true},
		{in: "1e30TiB", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := ParseBytes(c.in)
			if (err != nil) != c.wantErr || got != c.want {
				t.Fatalf("ParseBytes(%q) = %d, %v; want %d, error %v", c.in, got, err, c.want, c.wantErr)
			}
		})
	}
}

func TestFormatBytes(t *testing.T) {
	cases := []struct {
		in   int64
		want string
	}{
		{in: 512, want: "512B"},
		{in: 2048, want: "2KiB"},
		{in: 300 << 20, want: "300MiB"},
		{in: 3 << 29, want: "1.5GiB"},
		{in: 2 << 40, want: "2TiB"},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			if got := FormatBytes(c.in); got != c.want {
				t.Fatalf("FormatBytes(%d) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}

func TestKnobs_Resolve(t *testing.T) {
	cases := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(t *testing.T, cfg Config, k *Knobs)
	}{
		{
			name: "defaults",
			check: func(t *testing.T, cfg Config, k *Knobs) {
				if cfg.Tokens != DefaultTokens || cfg.MaxRunning != DefaultMaxRunning || cfg.ExitDuringStartup != nil || k.ListenAll || cfg.APIKey != "" {
					t.Fatalf("%+v", cfg)
				}
			},
		},
		{
			name: "flags",
			args: []string{"--startup-delay", "1500ms", "--tokens", "3", "--sim-weights", "2GiB", "--big-chunk-bytes", "64KiB", "--exit-during-startup", "0", "--listen-all"},
			check: func(t *testing.T, cfg Config, k *Knobs) {
				if cfg.StartupDelay != 1500*time.Millisecond || cfg.Tokens != 3 || cfg.Sim.Weights != 2<<30 || cfg.BigChunkBytes != 64<<10 || !k.ListenAll {
					t.Fatalf("%+v", cfg)
				}
				if cfg.ExitDuringStartup == nil || *cfg.ExitDuringStartup != 0 {
					t.Fatal("exit-during-startup 0 not kept")
				}
			},
		},
		{
			name: "environment fills what flags leave",
			args: []string{"--tokens", "5"},
			env: map[string]string{
				"CAPYCTL_FAKE_TOKENS": "9", "CAPYCTL_FAKE_MAX_RUNNING": "2", "CAPYCTL_FAKE_SIM_KV": "512MiB",
				"CAPYCTL_FAKE_LOG_SECRET": "1", "CAPYCTL_FAKE_FAIL_REQUESTS": "4",
			},
			check: func(t *testing.T, cfg Config, k *Knobs) {
				if cfg.Tokens != 5 || cfg.MaxRunning != 2 || cfg.Sim.KV != 512<<20 || !cfg.LogSecret || cfg.FailRequests != 4 {
					t.Fatalf("%+v", cfg)
				}
			},
		},
		{
			name: "gpu and key from their variables",
			env:  map[string]string{"CAPYCTL_SIMGPU_STATE": "/tmp/s.json", "CUDA_VISIBLE_DEVICES": "1", "FAKE_ENGINE_API_KEY": "sk-1"},
			check: func(t *testing.T, cfg Config, k *Knobs) {
				if cfg.Sim.StatePath != "/tmp/s.json" || cfg.Sim.Visible != "1" || cfg.APIKey != "sk-1" {
					t.Fatalf("%+v", cfg)
				}
			},
		},
		{
			name: "sim-state flag wins over the variable; key variable renamed",
			args: []string{"--sim-state", "/tmp/flag.json", "--api-key-env", "MY_KEY"},
			env:  map[string]string{"CAPYCTL_SIMGPU_STATE": "/tmp/env.json", "MY_KEY": "sk-2", "FAKE_ENGINE_API_KEY": "sk-1"},
			check: func(t *testing.T, cfg Config, k *Knobs) {
				if cfg.Sim.StatePath != "/tmp/flag.json" || cfg.APIKey != "sk-2" {
					t.Fatalf("%+v", cfg)
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			var cfg Config
			k := RegisterKnobs(fs, &cfg)
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			if err := k.Resolve(func(n string) string { return c.env[n] }); err != nil {
				t.Fatal(err)
			}
			c.check(t, cfg, k)
		})
	}
}

func TestKnobs_ResolveBadEnv(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var cfg Config
	k := RegisterKnobs(fs, &cfg)
	err := k.Resolve(func(n string) string {
		if n == "CAPYCTL_FAKE_SIM_WEIGHTS" {
			return "lots"
		}
		return ""
	})
	if err == nil || !strings.Contains(err.Error(), "CAPYCTL_FAKE_SIM_WEIGHTS") {
		t.Fatalf("err = %v", err)
	}
}

func TestAnswerTokens(t *testing.T) {
	// A golden answer: tests elsewhere may rely on answers staying the
	// same across versions of the fake.
	got := strings.Join(answerTokens("m", "hello there", 0, 5), "")
	if want := "sun to friends one flow"; got != want {
		t.Fatalf("answer %q, want %q", got, want)
	}
	if a, b := answerTokens("m", "x", 0, 8), answerTokens("m", "x", 0, 3); strings.Join(a[:3], "") != strings.Join(b, "") {
		t.Fatal("a shorter answer is not a prefix of a longer one")
	}
}

func TestSlots_Acquire(t *testing.T) {
	s := newSlots(1)
	ctx := context.Background()
	if err := s.acquire(ctx); err != nil {
		t.Fatal(err)
	}
	// Three waiters queue in order; the second gives up.
	order := make(chan int, 3)
	ctx2, cancel2 := context.WithCancelCause(ctx)
	errs := make(chan error, 3)
	for i, c := range []context.Context{ctx, ctx2, ctx} {
		go func() {
			err := s.acquire(c)
			errs <- err
			if err == nil {
				order <- i
			}
		}()
		waitUntil(t, func() bool { _, w := s.counts(); return w == i+1 })
	}
	cause := errors.New("gone")
	cancel2(cause)
	if err := <-errs; !errors.Is(err, cause) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	if r, w := s.counts(); r != 1 || w != 2 {
		t.Fatalf("running %d waiting %d", r, w)
	}
	s.release()
	if got := <-order; got != 0 {
		t.Fatalf("waiter %d went first, want 0", got)
	}
	// Paused: a release hands nothing out until resumed.
	s.setPaused(true)
	s.release()
	if r, w := s.counts(); r != 0 || w != 1 {
		t.Fatalf("paused: running %d waiting %d", r, w)
	}
	s.setPaused(false)
	if got := <-order; got != 2 {
		t.Fatalf("waiter %d, want 2", got)
	}
	s.release()
	if r, w := s.counts(); r != 0 || w != 0 {
		t.Fatalf("end: running %d waiting %d", r, w)
	}
}

// waitUntil polls cond with a deadline.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	poll.Until(t, 10*time.Second, "the condition", cond)
}
