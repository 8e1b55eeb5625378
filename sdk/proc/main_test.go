// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package proc

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary plays three parts besides running the tests: the shim
// (MaybeRunShim), a fake engine, and a "starter" that calls Start and is
// then killed. The part is chosen by $PROC_TEST_HELPER.
const helperEnv = "PROC_TEST_HELPER"

func TestMain(m *testing.M) {
	MaybeRunShim()
	switch os.Getenv(helperEnv) {
	case "":
		// Small knobs so that rotation and lingering are quick to test.
		testRotateBytes = 64 << 10
		os.Exit(m.Run())
	case "engine":
		os.Exit(fakeEngine())
	case "alloc":
		os.Exit(fakeAlloc())
	case "starter":
		os.Exit(starter())
	case "nocore":
		os.Exit(noCore())
	default:
		fmt.Fprintln(os.Stderr, "unknown helper", os.Getenv(helperEnv))
		os.Exit(2)
	}
}

// engineKeep keeps the fake engine's listeners and children referenced.
var engineKeep []any

// fakeEngine acts on $ENGINE_ACTIONS, a comma-separated list run in order:
//
//	print        print $ENGINE_PRINT on stdout and $ENGINE_PRINT_ERR on stderr
//	ignore-term  ignore SIGTERM (inherited by children started later)
//	child        start a grandchild (sleep) in the group, print "child <pid>"
//	listen=ADDR  listen on ADDR, print "listening <addr>"
//	alloc=MIB    start a child that allocates and touches MIB MiB
//	flood=BYTES  write BYTES of numbered lines
//	tick         print "tick N" every 5 ms, forever
//	llamalog=N   write llama-server's log of N answers a second, forever
//	             (llamaAnswerLog: its lines, one write each, in its bursts)
//	env          print "env " and the sorted environment joined by ";"
//	pwd          print "pwd " and the working directory
//	partial      print "partial line" without a newline
//	exit=N       exit with code N
//
// After the list it prints "ready" and blocks.
func fakeEngine() int {
	for _, action := range strings.Split(os.Getenv("ENGINE_ACTIONS"), ",") {
		name, arg, _ := strings.Cut(action, "=")
		switch name {
		case "":
		case "print":
			if s := os.Getenv("ENGINE_PRINT"); s != "" {
				fmt.Fprintln(os.Stdout, s)
			}
			if s := os.Getenv("ENGINE_PRINT_ERR"); s != "" {
				fmt.Fprintln(os.Stderr, s)
			}
		case "ignore-term":
			signal.Ignore(syscall.SIGTERM)
		case "child":
			c := exec.Command("/bin/sleep", "1000")
			c.Stdout, c.Stderr = os.Stdout, os.Stderr
			if err := c.Start(); err != nil {
				fmt.Println("child failed:", err)
				return 1
			}
			engineKeep = append(engineKeep, c)
			fmt.Println("child", c.Process.Pid)
		case "listen":
			ln, err := net.Listen("tcp", arg)
			if err != nil {
				fmt.Println("listen failed:", err)
				return 1
			}
			engineKeep = append(engineKeep, ln)
			fmt.Println("listening", ln.Addr())
		case "alloc":
			exe, _ := os.Executable()
			c := exec.Command(exe)
			c.Env = []string{helperEnv + "=alloc", "ALLOC_MIB=" + arg}
			c.Stdout, c.Stderr = os.Stdout, os.Stderr
			if err := c.Start(); err != nil {
				fmt.Println("alloc child failed:", err)
				return 1
			}
			engineKeep = append(engineKeep, c)
			fmt.Println("alloc child", c.Process.Pid)
		case "flood":
			n, _ := strconv.Atoi(arg)
			line := strings.Repeat("x", 90)
			for i := 0; n > 0; i++ {
				s := fmt.Sprintf("%08d %s\n", i, line)
				os.Stdout.WriteString(s)
				n -= len(s)
			}
		case "tick":
			for i := 0; ; i++ {
				fmt.Println("tick", i)
				time.Sleep(5 * time.Millisecond)
			}
		case "llamalog":
			n, _ := strconv.Atoi(arg)
			go writeLlamaLog(n)
		case "env":
			env := os.Environ()
			sort.Strings(env)
			fmt.Println("env", strings.Join(env, ";"))
		case "pwd":
			wd, _ := os.Getwd()
			fmt.Println("pwd", wd)
		case "partial":
			os.Stdout.WriteString("partial line")
		case "exit":
			n, _ := strconv.Atoi(arg)
			return n
		default:
			fmt.Println("unknown action", name)
			return 1
		}
	}
	fmt.Println("ready")
	select {}
}

// fakeAlloc allocates and touches $ALLOC_MIB MiB, says so, and blocks.
func fakeAlloc() int {
	n, _ := strconv.Atoi(os.Getenv("ALLOC_MIB"))
	buf := make([]byte, n<<20)
	for i := 0; i < len(buf); i += 4096 {
		buf[i] = 1
	}
	fmt.Println("allocated", n)
	select {}
}

// starter calls Start with the JSON spec in $STARTER_SPEC, prints the
// Launched as JSON, and blocks until killed.
func starter() int {
	var spec LaunchSpec
	if err := json.Unmarshal([]byte(os.Getenv("STARTER_SPEC")), &spec); err != nil {
		fmt.Println("bad spec:", err)
		return 2
	}
	l, err := Start(spec)
	if err != nil {
		fmt.Println("start failed:", err)
		return 1
	}
	b, _ := json.Marshal(l)
	fmt.Println(string(b))
	select {}
}
