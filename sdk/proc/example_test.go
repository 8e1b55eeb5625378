// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc_test

import (
	"fmt"
	"os"
	"time"

	"github.com/capyctl/capyctl/sdk/proc"
)

func ExampleRedactor() {
	r := proc.NewRedactor([]string{"k-123"})
	fmt.Println(r.RedactString("INFO key=k-123 HF_TOKEN=hf_abcdefghijklmnopqrstuv max_tokens=16 GET /v1/models"))
	// Output: INFO key=<redacted> HF_TOKEN=<redacted> max_tokens=16 GET /v1/models
}

// A driver's Start: launch, record the identities, later stop with proof.
func ExampleStart() {
	l, err := proc.Start(proc.LaunchSpec{
		Argv:      []string{"llama-server", "--host", "127.0.0.1", "--port", "8080"},
		Env:       map[string]string{"PATH": "/opt/llama/bin:/usr/bin:/bin", "LLAMA_API_KEY": "k-123"},
		LaunchDir: "/var/lib/capyctl/launches/demo-0-1",
		LogMode:   proc.LogModeFile,
		Secrets:   []string{"k-123"},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err) // names the program when it cannot run
		return
	}
	// Record l (pgid, shim and engine identities) in the launch's state.
	res, err := proc.Stop(*l, 10*time.Second)
	fmt.Println(res.Gone, err)
}
