// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
)

func TestHostFS_ReadHostMemory(t *testing.T) {
	const total, avail = int64(65536000) * 1024, int64(32768000) * 1024
	const gb = int64(1) << 30
	cases := []struct {
		name     string
		dir      string
		want     HostMemory
		capacity int64
	}{
		{
			name: "cgroup v2 under a systemd user service, names with @",
			dir:  "v2-user-at",
			want: HostMemory{TotalBytes: total, AvailableBytes: avail,
				CgroupPath:  "/user.slice/user-1000.slice/user@1000.service/app.slice/capyctl@gpu-a.service",
				CgroupLimit: 16 * gb, CgroupUsage: 1 * gb},
			capacity: 16 * gb,
		},
		{
			name:     "cgroup v2 namespace: the limit on the mount's root",
			dir:      "v2-namespace",
			want:     HostMemory{TotalBytes: total, AvailableBytes: avail, CgroupPath: "/", CgroupLimit: 8 * gb, CgroupUsage: gb / 2},
			capacity: 8 * gb,
		},
		{
			name:     "cgroup v2 without a limit",
			dir:      "v2-unlimited",
			want:     HostMemory{TotalBytes: total, AvailableBytes: avail, CgroupPath: "/system.slice/capyctl.service"},
			capacity: total,
		},
		{
			name:     "cgroup v1 docker on a hybrid machine",
			dir:      "v1-docker",
			want:     HostMemory{TotalBytes: total, AvailableBytes: avail, CgroupPath: "/docker/abc", CgroupLimit: 4 * gb, CgroupUsage: gb},
			capacity: 4 * gb,
		},
		{
			name:     "cgroup v1 unlimited",
			dir:      "v1-unlimited",
			want:     HostMemory{TotalBytes: total, AvailableBytes: avail},
			capacity: total,
		},
		{
			name:     "no cgroup file",
			dir:      "no-cgroup",
			want:     HostMemory{TotalBytes: total, AvailableBytes: avail},
			capacity: total,
		},
		{
			name:     "a limit above the machine's RAM",
			dir:      "v2-above-ram",
			want:     HostMemory{TotalBytes: total, AvailableBytes: avail, CgroupPath: "/a", CgroupLimit: 1 << 40},
			capacity: total,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := filepath.Join("testdata", "host", c.dir)
			fsys := HostFS{ProcRoot: filepath.Join(root, "proc"), CgroupRoot: filepath.Join(root, "cgroup")}
			got, err := fsys.ReadHostMemory()
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("ReadHostMemory() =\n  %+v\nwant\n  %+v", got, c.want)
			}
			if got.Capacity() != c.capacity {
				t.Fatalf("Capacity() = %d, want %d", got.Capacity(), c.capacity)
			}
		})
	}
}

func TestHostMemory_Available(t *testing.T) {
	h := HostMemory{TotalBytes: 64, AvailableBytes: 40, CgroupLimit: 16, CgroupUsage: 10}
	if got := h.Available(); got != 6 {
		t.Fatalf("Available() = %d, want what the cgroup has left (6)", got)
	}
	h = HostMemory{TotalBytes: 64, AvailableBytes: 40}
	if got := h.Available(); got != 40 {
		t.Fatalf("Available() = %d", got)
	}
}

func TestParseProcCgroup(t *testing.T) {
	cases := []struct {
		name, in, v2, v1 string
	}{
		{name: "v2", in: "0::/user.slice/user@1000.service\n", v2: "/user.slice/user@1000.service"},
		{name: "colon in a name", in: "0::/a:b/c@d\n", v2: "/a:b/c@d"},
		{name: "v1 memory among several", in: "5:cpu,memory:/x\n0::/\n", v2: "/", v1: "/x"},
		{name: "garbage", in: "nonsense\n3:memory\n", v2: "", v1: ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v2, v1 := parseProcCgroup([]byte(c.in))
			if v2 != c.v2 || v1 != c.v1 {
				t.Fatalf("parseProcCgroup = %q, %q; want %q, %q", v2, v1, c.v2, c.v1)
			}
		})
	}
	if _, ok := cleanCgroupPath("/a/../../etc"); ok {
		t.Fatal("a path leaving the hierarchy was accepted")
	}
}

func TestParseStat(t *testing.T) {
	p, err := parseStat(42, []byte("42 (my (odd) name) S 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 12345 1 1"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Comm != "my (odd) name" || p.PPID != 1 || p.PGID != 42 || p.StartTicks != 12345 {
		t.Fatalf("parsed %+v", p)
	}
	if _, err := parseStat(43, []byte("43 (z) Z 1 43 43 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1 1 1")); err == nil {
		t.Fatal("a zombie read as alive")
	}
}

func TestEngineProcesses(t *testing.T) {
	// shim 100 (group leader) → engine 101 → worker 102, ninja 103 → nvcc
	// 104 → cicc 105; 106 is in the group but re-parented to init; 107
	// left the group with setsid but is the engine's child; 200 is
	// unrelated.
	table := []ProcessInfo{
		{PID: 100, PPID: 1, PGID: 100, Comm: "capyctl"},
		{PID: 101, PPID: 100, PGID: 100, Comm: "python3"},
		{PID: 102, PPID: 101, PGID: 100, Comm: "VLLM::Worker"},
		{PID: 103, PPID: 101, PGID: 100, Comm: "ninja"},
		{PID: 104, PPID: 103, PGID: 100, Comm: "sh"},
		{PID: 105, PPID: 104, PGID: 100, Comm: "cicc"},
		{PID: 106, PPID: 1, PGID: 100, Comm: "python3"},
		{PID: 107, PPID: 101, PGID: 107, Comm: "torch-compile"},
		{PID: 200, PPID: 1, PGID: 200, Comm: "bash"},
	}
	engine, compilers := EngineProcesses(table, 100, 101, 100)
	sort.Ints(engine)
	sort.Ints(compilers)
	if want := []int{101, 102, 106, 107}; !reflect.DeepEqual(engine, want) {
		t.Fatalf("engine = %v, want %v", engine, want)
	}
	if want := []int{103, 104, 105}; !reflect.DeepEqual(compilers, want) {
		t.Fatalf("compilers = %v, want %v", compilers, want)
	}
}

func TestHostFS_OwnProcess(t *testing.T) {
	table := DefaultHostFS.Processes()
	self := os.Getpid()
	var found bool
	for _, p := range table {
		if p.PID == self {
			found = true
		}
	}
	if !found {
		t.Fatal("the process table lacks this process")
	}
	rss, err := DefaultHostFS.ResidentBytes(self)
	if err != nil || rss <= 0 {
		t.Fatalf("resident bytes of self: %d %v", rss, err)
	}
}
