// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginekit

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/decisions"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/proc"
)

// ReadyFunc runs the readiness checks once: ready, the canary answer, or
// what is still missing.
type ReadyFunc func(ctx context.Context) (ready bool, canary, why string)

// WatchFunc looks for a launch that failed while its main process lives
// (SGLang's scheduler dying); it returns a detail when it did.
type WatchFunc func() (failed bool, detail string)

// WaitReady polls finely (engineapi.Poll: 1 ms, growing to 250 ms) until
// ready says so, the engine exits, watch reports a failure, the group
// listens off loopback (checked every offLoopbackEvery while waiting and
// once more when ready says so), or the deadline passes. On a failure seen
// by watch, fail runs (to end the launch and clean up) before the answer is
// returned.
func (in *Instance) WaitReady(ctx context.Context, deadline time.Duration, ready ReadyFunc, watch WatchFunc, fail func()) *sdk.ProbeResponse {
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	why := "starting"
	var out *sdk.ProbeResponse
	// A launch just started listens nowhere yet: the first check is due
	// after offLoopbackFirst (or when ready says so, whatever the time).
	// It reads every process in /proc; the checks after it, the one at
	// ready among them, read only what changed since (proc.Group).
	lastListen := time.Now().Add(offLoopbackFirst - offLoopbackEvery)
	_ = engineapi.Poll(ctx, func(ctx context.Context) (bool, error) {
		if !in.Alive() {
			out = in.ExitInfo("the engine exited while " + why)
			return true, nil
		}
		if watch != nil {
			if failed, detail := watch(); failed {
				lines := proc.LastLines(in.Launched.LaunchDir, lastLogLines)
				if fail != nil {
					fail()
				}
				out = &sdk.ProbeResponse{Exited: true, ExitCode: int32(exitCode(in.Launched.LaunchDir)), Code: sdk.CodeLaunchFailed, Detail: detail, LastLogLines: lines}
				return true, nil
			}
		}
		// The listeners are read from /proc (a millisecond for a large
		// group): not on every fine poll.
		if time.Since(lastListen) >= offLoopbackEvery {
			lastListen = time.Now()
			if out = in.offLoopback(); out != nil {
				return true, nil
			}
		}
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		ok, canary, w := ready(rctx)
		rcancel()
		if ok {
			// A listener may appear late: check once more before serving.
			if out = in.offLoopback(); out != nil {
				return true, nil
			}
			in.SetCanary(canary)
			out = &sdk.ProbeResponse{Alive: true, Ready: true, Endpoint: *in.Endpoint, Canary: canary}
			return true, nil
		}
		why = w
		return false, nil
	})
	if out != nil {
		return out
	}
	return &sdk.ProbeResponse{
		Alive: in.Alive(), Code: sdk.CodeStartupTimeout,
		Detail:       fmt.Sprintf("not ready within %s (last: %s)", deadline, why),
		LastLogLines: proc.LastLines(in.Launched.LaunchDir, lastLogLines),
	}
}

// offLoopbackEvery spaces the listener checks of a launch that is not
// ready yet; a launch that becomes ready is checked then, whatever the
// time.
const offLoopbackEvery = 50 * time.Millisecond

// offLoopbackFirst is when the first listener check of a launch is due: a
// full read of /proc early in the start, while the engine loads, rather
// than at ready, where its milliseconds would delay the first request.
const offLoopbackFirst = 10 * time.Millisecond

// ChatReady is the usual ReadyFunc of a chat engine: the served name in
// /v1/models, then a real short answer to the canary prompt (content or
// reasoning both count). extra fields are merged into the request. An
// embedding model (API "embeddings"), which answers no chat, is asked for
// the prompt's embedding instead (engineapi.EmbeddingsProbe), and a
// reranker (API "rerank") to score documents against it
// (engineapi.RerankProbe).
func (in *Instance) ChatReady(prompt string, maxTokens int, extra map[string]any) ReadyFunc {
	return func(ctx context.Context) (bool, string, string) {
		if why := in.ServedListed(ctx); why != "" {
			return false, "", why
		}
		var answer string
		var err error
		switch in.API {
		case "embeddings":
			answer, err = engineapi.EmbeddingsProbe(ctx, in.Client, in.ServedName, prompt)
		case "rerank":
			answer, err = engineapi.RerankProbe(ctx, in.Client, in.ServedName, prompt, engineapi.RerankCanaryDocuments)
		default:
			answer, err = engineapi.ChatProbeExtra(ctx, in.Client, in.Endpoint.ChatPath, in.ServedName, prompt, maxTokens, extra)
		}
		if err != nil {
			return false, "", "waiting for a first answer: " + err.Error()
		}
		return true, answer, ""
	}
}

// offLoopback stops a launch whose group listens on a non-loopback address
// and describes it; nil when every listener is on loopback (or, for a
// group member, is one of its peer listeners: groupListener). The last lines
// are read before the stop (in memory mode they leave with the shim).
func (in *Instance) offLoopback() *sdk.ProbeResponse {
	if in.Endpoint.Listener == ListenerNetns {
		// The listeners are read through sock_diag in the driver's
		// namespace, which cannot see the engine's; and in a namespace of
		// its own the engine has nothing but loopback to listen on.
		return nil
	}
	bad := in.offLoopbackAddr()
	if bad == "" {
		return nil
	}
	lines := proc.LastLines(in.Launched.LaunchDir, lastLogLines)
	res, _ := proc.Stop(in.Launched, in.StopGrace)
	return &sdk.ProbeResponse{Exited: true, ExitCode: int32(res.ExitCode), Code: sdk.CodeOffLoopback,
		Detail: fmt.Sprintf("the engine listened on %s, not only on loopback; it was stopped", bad), LastLogLines: lines}
}

// ProbeDeadline is a readiness probe's deadline: the request's, else def.
func ProbeDeadline(req *sdk.ProbeRequest, def time.Duration) time.Duration {
	if d := req.Deadline; d > 0 {
		return d
	}
	return def
}

// ServedListed checks that /v1/models lists the served name: "" when it
// does, else what readiness waits for.
func (in *Instance) ServedListed(ctx context.Context) string {
	found, err := engineapi.ModelsContain(ctx, in.Client, in.ServedName)
	if err != nil {
		return "waiting for the model list: " + err.Error()
	}
	if !found {
		return "waiting for " + in.ServedName + " in " + engineapi.ModelsPath
	}
	return ""
}

// ReadinessDecision sends the fixed readiness decision (sdk/decisions) to
// a decision model at path: the answer when it is complete, else what
// readiness waits for (wait names a request that failed).
func ReadinessDecision(ctx context.Context, c *engineapi.EngineClient, path, served, wait string) (*decisions.Response, string) {
	req := decisions.ReadinessRequest(served)
	var resp decisions.Response
	status, err := c.PostJSON(ctx, path, req, &resp)
	if err != nil {
		return nil, wait + ": " + err.Error()
	}
	if status != http.StatusOK {
		return nil, fmt.Sprintf("the readiness decision answered %d", status)
	}
	if err := decisions.Check(req, &resp); err != nil {
		return nil, "the readiness decision is incomplete: " + err.Error()
	}
	return &resp, ""
}
