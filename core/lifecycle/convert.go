// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// ToInstallation converts an engine registration for a driver.
func ToInstallation(e *structs.EngineRecord) *sdk.Installation {
	return &sdk.Installation{
		Name:     e.Name,
		Family:   e.Family,
		Path:     e.Path,
		Version:  e.Version,
		Verified: e.Verified,
		Digest:   e.Digest,
		Details:  e.Details,
	}
}

// ToDeployment converts a completed spec for a driver.
func ToDeployment(spec *structs.Deployment, revision uint64, modelDir string) *sdk.Deployment {
	ec := spec.EngineConfig
	d := &sdk.Deployment{
		Name:                  spec.Name,
		Revision:              revision,
		API:                   spec.API,
		ServedName:            servedName(spec),
		ModelDir:              modelDir,
		Residency:             spec.Residency,
		LMCache:               spec.LMCache,
		LMCachePoolBytes:      int64(spec.LMCachePool),
		MaxConcurrentRequests: int32(ec.MaxConcurrentRequests),
		ContextLength:         ec.ContextLength,
		Dtype:                 ec.Dtype,
		Quantization:          ec.Quantization,
		KVCacheDtype:          ec.KVCacheDtype,
		TrustRemoteCode:       ec.TrustRemoteCode,
		AcceptExtraArgs:       ec.AcceptExtraArgs,
		ExtraArgs:             ec.ExtraArgs,
		Env:                   ec.Env,
		Memory: sdk.MemorySizes{
			RequestBytes: int64(ec.Memory.Request),
			KVCacheBytes: int64(ec.Memory.KVCache),
			StartupBytes: int64(ec.Memory.Startup),
		},
	}
	if g := spec.Group; g != nil {
		d.Group = &sdk.Group{
			Rank: int32(g.Rank), Size: int32(g.Size), HeadAddress: g.HeadAddress, RendezvousPort: int32(g.RendezvousPort),
			PeerAddress: g.PeerAddress, RequireRDMA: g.RequireRDMA,
		}
		if t := spec.Topology; t != nil {
			d.Group.TensorParallel, d.Group.PipelineParallel = int32(t.TensorParallel), int32(t.PipelineParallel)
		}
	}
	if ec.CUDAGraphs != nil {
		d.CUDAGraphs = strconv.FormatBool(*ec.CUDAGraphs)
	}
	if spec.Resources != nil {
		d.Resources = sdk.Resources{Declared: true, DeviceBytes: int64(spec.Resources.GPU), HostBytes: int64(spec.Resources.RAM)}
		if ready, ok := spec.Resources.Phases["ready"]; ok && spec.Resources.GPU == 0 && spec.Resources.RAM == 0 {
			d.Resources.DeviceBytes = int64(ready.GPU)
			d.Resources.HostBytes = int64(ready.RAM)
		}
	}
	return d
}

// familyConfig returns the engine_config.<family> block as JSON.
func familyConfig(spec *structs.Deployment, family string) []byte {
	if raw, ok := spec.EngineConfig.Family[family]; ok {
		return raw
	}
	return nil
}

// servedName is the name the engine serves: the first route.
func servedName(spec *structs.Deployment) string {
	if len(spec.Routes) > 0 {
		return spec.Routes[0]
	}
	return spec.Name
}

// hostPolicy merges the host's policy with an engine registration's
// approvals.
func (m *Manager) hostPolicy(e *structs.EngineRecord) *sdk.HostPolicy {
	var hp *sdk.HostPolicy
	if m.cfg.Host.Policy != nil {
		cp := *m.cfg.Host.Policy
		cp.ApprovedOptions = slices.Clone(cp.ApprovedOptions)
		cp.ApprovedPaths = slices.Clone(cp.ApprovedPaths)
		cp.ApprovedEnv = slices.Clone(cp.ApprovedEnv)
		cp.HostEnv = maps.Clone(cp.HostEnv)
		hp = &cp
	} else {
		hp = &sdk.HostPolicy{}
	}
	if e != nil {
		hp.ApprovedOptions = append(hp.ApprovedOptions, e.Approvals.Options...)
		hp.ApprovedPaths = append(hp.ApprovedPaths, e.Approvals.Paths...)
		hp.ApprovedEnv = append(hp.ApprovedEnv, e.Approvals.Env...)
		hp.AllowRemoteCode = hp.AllowRemoteCode || e.Approvals.RemoteCode
		if len(e.Env) > 0 {
			if hp.HostEnv == nil {
				hp.HostEnv = map[string]string{}
			}
			for k, v := range e.Env {
				hp.HostEnv[k] = v
			}
		}
	}
	return hp
}

// toEndpoint converts a driver endpoint; nil when the driver gave none
// (no base URL: a zero sdk.Endpoint is an absent one).
func toEndpoint(e *sdk.Endpoint) *structs.EngineEndpoint {
	if e == nil || e.BaseURL == "" {
		return nil
	}
	return &structs.EngineEndpoint{
		BaseURL:         e.BaseURL,
		AuthHeader:      e.AuthHeader,
		AuthValue:       e.AuthValue,
		ChatPath:        e.ChatPath,
		DecisionsPath:   e.DecisionsPath,
		CompletionsPath: e.CompletionsPath,
		RequestIDField:  e.RequestIDField,
		RequestIDHeader: e.RequestIDHeader,
		AbortByID:       e.AbortMode == sdk.AbortModeRequestID,
		ServedName:      e.ServedName,
		// IMPORTANT: only an engine declared to stop a non-streamed request
		// on a hang-up gets it as is; unspecified means stream.
		ForwardNonStreamed: e.NonStreamedHangup == sdk.NonStreamedHangupStops,
		Exposure:           toExposure(e),
		CacheSalt:          e.CacheSalt,
		MessagesPath:       e.MessagesPath,
		CountTokensPath:    e.CountTokensPath,
		ResponsesPath:      e.ResponsesPath,
	}
}

// toExposure is what the driver says of who can reach the engine; a driver
// that says nothing listens on TCP with nothing reported.
func toExposure(e *sdk.Endpoint) *structs.Exposure {
	if e.Listener == "" && len(e.OpenRoutes) == 0 && e.ExposureNote == "" {
		return nil
	}
	return &structs.Exposure{Listener: e.Listener, OpenRoutes: e.OpenRoutes, Note: e.ExposureNote}
}

// toLaunch converts a recorded launch for a driver.
func toLaunch(l *structs.LaunchRecord) *sdk.Launch {
	if l == nil {
		return nil
	}
	out := &sdk.Launch{Pgid: int32(l.Pgid), LaunchDir: l.LaunchDir, Port: int32(l.Port), LMCachePort: int32(l.LMCachePort), LaunchID: l.LaunchID}
	for _, p := range l.Processes {
		out.Processes = append(out.Processes, &sdk.ProcessIdentity{Pid: int32(p.PID), StartTicks: p.StartTicks, Role: p.Role})
	}
	return out
}

func fromLaunch(l *sdk.Launch) []structs.ProcessIdentity {
	var out []structs.ProcessIdentity
	for _, p := range l.Processes {
		out = append(out, structs.ProcessIdentity{PID: int(p.Pid), StartTicks: p.StartTicks, Role: p.Role})
	}
	return out
}

// jsonOrNil marshals v, nil on error.
func jsonOrNil(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	return b
}
