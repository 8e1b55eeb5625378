// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package engineapi_test

import (
	"fmt"
	"strings"

	"github.com/capyctl/capyctl/sdk/engineapi"
)

func ExampleParseMetrics() {
	body := `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
`
	m, err := engineapi.ParseMetrics(strings.NewReader(body))
	if err != nil {
		fmt.Println(err)
		return
	}
	running, _ := m.SumMatching("vllm:num_requests_running", map[string]string{"model_name": "m"})
	waiting, _ := m.Value("vllm:num_requests_waiting", map[string]string{"model_name": "m"})
	fmt.Println(running, waiting)
	// Output: 3 4
}

func ExampleSSEReader() {
	stream := "data: {\"choices\":[]}\n\nerror: {\"message\":\"context shift is disabled\"}\ndata: [DONE]\n\n"
	r := engineapi.NewSSEReader(strings.NewReader(stream))
	for {
		ev, err := r.Next()
		if err != nil {
			break
		}
		fmt.Printf("%s %s done=%v\n", ev.Field, ev.Data, ev.Done())
	}
	// Output:
	// data {"choices":[]} done=false
	// error {"message":"context shift is disabled"} done=false
	// data [DONE] done=true
}
