// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// llamaAnswerLog is what llama-server (b4748, stories260K, one answer of 64
// tokens to a chat request) writes to its log per answer, as observed: each
// line in a write of its own, in bursts at the answer's start, at its end
// and after the HTTP response.
var llamaAnswerLog = [][]string{
	{
		"srv  params_from_: Chat format: Content-only\n",
		"slot launch_slot_: id  0 | task %d | processing task\n",
		"slot update_slots: id  0 | task %d | new prompt, n_ctx_slot = 1024, n_keep = 0, n_prompt_tokens = 46\n",
		"slot update_slots: id  0 | task %d | kv cache rm [0, end)\n",
		"slot update_slots: id  0 | task %d | prompt processing progress, n_past = 46, n_tokens = 46, progress = 1.000000\n",
		"slot update_slots: id  0 | task %d | prompt done, n_past = 46, n_tokens = 46\n",
	},
	{
		"slot      release: id  0 | task %d | stop processing: n_past = 109, truncated = 0\n",
		"slot print_timing: id  0 | task %d | \n",
		"prompt eval time =       3.15 ms /    46 tokens (    0.07 ms per token, 14603.17 tokens per second)\n",
		"       eval time =     416.59 ms /    64 tokens (    6.51 ms per token,   153.63 tokens per second)\n",
		"      total time =     421.61 ms /   110 tokens\n",
	},
	{
		"srv  update_slots: all slots are idle\n",
		"srv  log_server_r: request: POST /v1/chat/completions 127.0.0.1 200\n",
	},
}

// writeLlamaLog writes llamaAnswerLog for n answers a second, its bursts
// spread evenly, forever.
func writeLlamaLog(n int) {
	every := time.Second / time.Duration(n*len(llamaAnswerLog))
	next := time.Now()
	for task := 0; ; task++ {
		for _, burst := range llamaAnswerLog {
			for _, line := range burst {
				if strings.Contains(line, "%d") {
					line = fmt.Sprintf(line, task)
				}
				os.Stdout.WriteString(line)
			}
			next = next.Add(every)
			time.Sleep(time.Until(next))
		}
	}
}

// BenchmarkShim_EngineLog is the shim's cost per answer of an engine that
// logs as llama-server does, at 50 and 200 answers a second (200: about
// what llama-server with stories260K answers at concurrency 4 on two
// cores): the shim's CPU time from schedstat (all its threads), its
// context switches and read(2) calls, per answer, over 2 s.
func BenchmarkShim_EngineLog(b *testing.B) {
	for _, rate := range []int{50, 200} {
		b.Run(fmt.Sprintf("answers=%d/s", rate), func(b *testing.B) {
			spec := LaunchSpec{
				Argv:      []string{os.Args[0]},
				Env:       map[string]string{helperEnv: "engine", "ENGINE_ACTIONS": "llamalog=" + strconv.Itoa(rate), "GORACE": "atexit_sleep_ms=0"},
				LaunchDir: filepath.Join(b.TempDir(), "launch"),
				LogMode:   LogModeFile,
			}
			// The default rotation size, not the tests' small one.
			defer func(v int64) { testRotateBytes = v }(testRotateBytes)
			testRotateBytes = 0
			l, err := Start(spec)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _, _ = Stop(*l, 0); _ = Release(l.LaunchDir) }()
			time.Sleep(500 * time.Millisecond)
			for range b.N {
			}
			cpu0, cs0, rd0 := shimCounters(l.Shim.PID)
			n0 := answersLogged(l.LaunchDir)
			time.Sleep(2 * time.Second)
			cpu1, cs1, rd1 := shimCounters(l.Shim.PID)
			n := answersLogged(l.LaunchDir) - n0
			if n <= 0 {
				b.Fatal("no answer logged")
			}
			b.ReportMetric(float64(cpu1-cpu0)/1e3/float64(n), "shim-µs/answer")
			b.ReportMetric(float64(cs1-cs0)/float64(n), "switches/answer")
			b.ReportMetric(float64(rd1-rd0)/float64(n), "reads/answer")
		})
	}
}

// shimCounters are a process's CPU time in ns (schedstat, all its
// threads), context switches and read(2) calls.
func shimCounters(pid int) (cpu, switches, reads int64) {
	dir := fmt.Sprintf("/proc/%d", pid)
	tasks, _ := os.ReadDir(dir + "/task")
	for _, t := range tasks {
		if data, err := os.ReadFile(dir + "/task/" + t.Name() + "/schedstat"); err == nil {
			if f := strings.Fields(string(data)); len(f) > 0 {
				v, _ := strconv.ParseInt(f[0], 10, 64)
				cpu += v
			}
		}
		if data, err := os.ReadFile(dir + "/task/" + t.Name() + "/status"); err == nil {
			for _, line := range strings.Split(string(data), "\n") {
				if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
					n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					switches += n
				}
			}
		}
	}
	if data, err := os.ReadFile(dir + "/io"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "syscr: "); ok {
				reads, _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return cpu, switches, reads
}

// answersLogged counts the answers in an engine's log file.
func answersLogged(dir string) int {
	data, _ := os.ReadFile(filepath.Join(dir, LogFileName))
	return strings.Count(string(data), "log_server_r")
}
