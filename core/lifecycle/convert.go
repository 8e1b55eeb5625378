// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"encoding/json"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/capyctl/capyctl/core/structs"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// ToInstallation converts an engine registration for a driver.
func ToInstallation(e *structs.EngineRecord) *pb.Installation {
	return &pb.Installation{
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
func ToDeployment(spec *structs.Deployment, revision uint64, modelDir string) *pb.Deployment {
	ec := spec.EngineConfig
	d := &pb.Deployment{
		Name:                  spec.Name,
		Revision:              revision,
		Api:                   spec.API,
		ServedName:            servedName(spec),
		ModelDir:              modelDir,
		Residency:             spec.Residency,
		Lmcache:               spec.LMCache,
		LmcachePoolBytes:      int64(spec.LMCachePool),
		MaxConcurrentRequests: int32(ec.MaxConcurrentRequests),
		ContextLength:         ec.ContextLength,
		Dtype:                 ec.Dtype,
		Quantization:          ec.Quantization,
		KvCacheDtype:          ec.KVCacheDtype,
		TrustRemoteCode:       ec.TrustRemoteCode,
		AcceptExtraArgs:       ec.AcceptExtraArgs,
		ExtraArgs:             ec.ExtraArgs,
		Env:                   ec.Env,
		Memory: &pb.MemorySizes{
			RequestBytes: int64(ec.Memory.Request),
			KvCacheBytes: int64(ec.Memory.KVCache),
			StartupBytes: int64(ec.Memory.Startup),
		},
	}
	if g := spec.Group; g != nil {
		d.Group = &pb.Group{
			Rank: int32(g.Rank), Size: int32(g.Size), HeadAddress: g.HeadAddress, RendezvousPort: int32(g.RendezvousPort),
			PeerAddress: g.PeerAddress, RequireRdma: g.RequireRDMA,
		}
		if t := spec.Topology; t != nil {
			d.Group.TensorParallel, d.Group.PipelineParallel = int32(t.TensorParallel), int32(t.PipelineParallel)
		}
	}
	if ec.CUDAGraphs != nil {
		d.CudaGraphs = strconv.FormatBool(*ec.CUDAGraphs)
	}
	if spec.Resources != nil {
		d.Resources = &pb.Resources{Declared: true, DeviceBytes: int64(spec.Resources.GPU), HostBytes: int64(spec.Resources.RAM)}
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
func (m *Manager) hostPolicy(e *structs.EngineRecord) *pb.HostPolicy {
	var hp *pb.HostPolicy
	if m.cfg.Host.Policy != nil {
		hp = proto.Clone(m.cfg.Host.Policy).(*pb.HostPolicy)
	} else {
		hp = &pb.HostPolicy{}
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

// toEndpoint converts a driver endpoint.
func toEndpoint(e *pb.Endpoint) *structs.EngineEndpoint {
	if e == nil {
		return nil
	}
	return &structs.EngineEndpoint{
		BaseURL:         e.GetBaseUrl(),
		AuthHeader:      e.GetAuthHeader(),
		AuthValue:       e.GetAuthValue(),
		ChatPath:        e.GetChatPath(),
		DecisionsPath:   e.GetDecisionsPath(),
		CompletionsPath: e.GetCompletionsPath(),
		RequestIDField:  e.GetRequestIdField(),
		RequestIDHeader: e.GetRequestIdHeader(),
		AbortByID:       e.GetAbortMode() == pb.AbortMode_ABORT_MODE_REQUEST_ID,
		ServedName:      e.GetServedName(),
		// IMPORTANT: only an engine declared to stop a non-streamed request
		// on a hang-up gets it as is; unspecified means stream.
		ForwardNonStreamed: e.GetNonStreamedHangup() == pb.NonStreamedHangup_NON_STREAMED_HANGUP_STOPS,
		Exposure:           toExposure(e),
		CacheSalt:          e.GetCacheSalt(),
		MessagesPath:       e.GetMessagesPath(),
		CountTokensPath:    e.GetCountTokensPath(),
		ResponsesPath:      e.GetResponsesPath(),
	}
}

// toExposure is what the driver says of who can reach the engine; a driver
// that says nothing listens on TCP with nothing reported.
func toExposure(e *pb.Endpoint) *structs.Exposure {
	if e.GetListener() == "" && len(e.GetOpenRoutes()) == 0 && e.GetExposureNote() == "" {
		return nil
	}
	return &structs.Exposure{Listener: e.GetListener(), OpenRoutes: e.GetOpenRoutes(), Note: e.GetExposureNote()}
}

// toLaunch converts a recorded launch for a driver.
func toLaunch(l *structs.LaunchRecord) *pb.Launch {
	if l == nil {
		return nil
	}
	out := &pb.Launch{Pgid: int32(l.Pgid), LaunchDir: l.LaunchDir, Port: int32(l.Port), LmcachePort: int32(l.LMCachePort), LaunchId: l.LaunchID}
	for _, p := range l.Processes {
		out.Processes = append(out.Processes, &pb.ProcessIdentity{Pid: int32(p.PID), StartTicks: p.StartTicks, Role: p.Role})
	}
	return out
}

func fromLaunch(l *pb.Launch) []structs.ProcessIdentity {
	var out []structs.ProcessIdentity
	for _, p := range l.GetProcesses() {
		out = append(out, structs.ProcessIdentity{PID: int(p.GetPid()), StartTicks: p.GetStartTicks(), Role: p.GetRole()})
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
