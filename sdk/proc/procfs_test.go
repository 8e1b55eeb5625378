// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package proc

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
)

func TestParseStat(t *testing.T) {
	rest := " 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 12345 20 21"
	cases := []struct {
		name    string
		in      string
		want    statInfo
		wantErr bool
	}{
		{
			name: "plain",
			in:   "42 (sleep) S 7 42 42 0 -1 4194304 1 0 0 0 0 0 0 0 20 0 1 0 98765 1 2",
			want: statInfo{state: 'S', ppid: 7, pgrp: 42, session: 42, startTicks: 98765},
		},
		{
			name: "name with spaces and parentheses",
			in:   "9 (a) b) (c d) Z 1 2 3" + rest,
			want: statInfo{state: 'Z', ppid: 1, pgrp: 2, session: 3, startTicks: 12345},
		},
		{name: "no name", in: "9 a b c", wantErr: true},
		{name: "short", in: "9 (x) S 1 2 3", wantErr: true},
		{name: "bad number", in: "9 (x) S one 2 3" + rest, wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseStat([]byte(c.in))
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, c.wantErr)
			}
			if err == nil && got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestAlive(t *testing.T) {
	self := os.Getpid()
	ticks, err := ReadStartTicks(self)
	if err != nil || ticks == 0 {
		t.Fatalf("ReadStartTicks(self) = %d, %v", ticks, err)
	}
	// A zombie: a child that exited and is not reaped yet.
	z := exec.Command("/bin/true")
	if err := z.Start(); err != nil {
		t.Fatal(err)
	}
	zTicks, _ := ReadStartTicks(z.Process.Pid)
	eventually(t, "the zombie", func() bool {
		s, err := readStat(z.Process.Pid)
		return err == nil && s.dead()
	})
	zombie := Identity{PID: z.Process.Pid, StartTicks: zTicks}
	defer z.Wait()

	cases := []struct {
		name string
		id   Identity
		want bool
	}{
		{name: "self", id: Identity{PID: self, StartTicks: ticks}, want: true},
		{name: "other start time", id: Identity{PID: self, StartTicks: ticks + 1}, want: false},
		{name: "zombie", id: zombie, want: false},
		{name: "no pid", id: Identity{}, want: false},
		{name: "absent", id: Identity{PID: 1 << 30, StartTicks: 1}, want: false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Alive(c.id); got != c.want {
				t.Errorf("Alive(%+v) = %v, want %v", c.id, got, c.want)
			}
		})
	}
}

func TestTreeMemory(t *testing.T) {
	const mib = 64
	l := startEngine(t, engineSpec(t, "alloc="+strconv.Itoa(mib), nil))
	text := waitTail(t, l.LaunchDir, "allocated")
	m := regexp.MustCompile(`alloc child (\d+)`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no alloc child in:\n%s", text)
	}
	child, _ := strconv.Atoi(m[1])
	if d := Descendants(l.Engine.PID); !containsInt(d, child) {
		t.Errorf("Descendants(engine) = %v, want %d", d, child)
	}
	if d := Descendants(l.Shim.PID); !containsInt(d, child) || !containsInt(d, l.Engine.PID) {
		t.Errorf("Descendants(shim) = %v, want engine and child", d)
	}
	own, _, err := readStatusMemory(l.Engine.PID)
	if err != nil {
		t.Fatal(err)
	}
	rss, hwm, err := TreeMemory(l.Engine.PID)
	if err != nil {
		t.Fatal(err)
	}
	if rss < mib<<20 || rss <= own || hwm < rss {
		t.Errorf("TreeMemory = rss %d hwm %d (engine alone %d), want rss >= %d", rss, hwm, own, mib<<20)
	}
	if _, _, err := TreeMemory(1 << 30); err == nil {
		t.Error("TreeMemory of an absent pid succeeded")
	}
}

func TestProcessName(t *testing.T) {
	cases := []struct {
		name string
		pid  int
		want string
	}{
		{name: "absent", pid: 1 << 30, want: ""},
		{name: "invalid", pid: -1, want: ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ProcessName(c.pid); got != c.want {
				t.Errorf("ProcessName(%d) = %q, want %q", c.pid, got, c.want)
			}
		})
	}
	if ProcessName(os.Getpid()) == "" {
		t.Error("ProcessName(self) is empty")
	}
}

// TestReadStat_LongerThanTheBuffer: a stat line that fills the first read's
// buffer is read again whole, not parsed cut.
func TestReadStat_LongerThanTheBuffer(t *testing.T) {
	want, err := readStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{16, 64, 200} {
		got, err := readStatInto(os.Getpid(), make([]byte, size))
		if err != nil || got.pgrp != want.pgrp || got.session != want.session || got.startTicks != want.startTicks {
			t.Errorf("buffer of %d: %+v (%v), want %+v", size, got, err, want)
		}
	}
}
