// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package plugin

// The conversions between the SDK's Go types and the generated protobuf
// messages, one pair per message. IMPORTANT: a field added to the .proto
// and to the Go type must be added here too; TestConvert_RoundTrip fills
// every field of both forms and fails on a field left out.

import (
	"reflect"
	"time"

	"github.com/capyctl/capyctl/sdk"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

func describeRequestToPB(in *sdk.DescribeRequest) *pb.DescribeRequest {
	if in == nil {
		return nil
	}
	return &pb.DescribeRequest{}
}

func describeRequestFromPB(in *pb.DescribeRequest) sdk.DescribeRequest {
	if in == nil {
		return sdk.DescribeRequest{}
	}
	return sdk.DescribeRequest{}
}

func describeResponseToPB(in *sdk.DescribeResponse) *pb.DescribeResponse {
	if in == nil {
		return nil
	}
	return &pb.DescribeResponse{
		Name:         in.Name,
		Version:      in.Version,
		Protocol:     in.Protocol,
		Capabilities: valueToPB(&in.Capabilities, capabilitiesToPB),
		ConfigSchema: in.ConfigSchema,
	}
}

func describeResponseFromPB(in *pb.DescribeResponse) sdk.DescribeResponse {
	if in == nil {
		return sdk.DescribeResponse{}
	}
	return sdk.DescribeResponse{
		Name:         in.Name,
		Version:      in.Version,
		Protocol:     in.Protocol,
		Capabilities: capabilitiesFromPB(in.Capabilities),
		ConfigSchema: in.ConfigSchema,
	}
}

func capabilitiesToPB(in *sdk.Capabilities) *pb.Capabilities {
	if in == nil {
		return nil
	}
	return &pb.Capabilities{
		ParkTiers:       in.ParkTiers,
		Apis:            in.APIs,
		AbortMode:       pb.AbortMode(in.AbortMode),
		IdleSignal:      in.IdleSignal,
		Groups:          in.Groups,
		Lmcache:         in.LMCache,
		RequestIdField:  in.RequestIDField,
		RequestIdHeader: in.RequestIDHeader,
		TierPerPark:     in.TierPerPark,
	}
}

func capabilitiesFromPB(in *pb.Capabilities) sdk.Capabilities {
	if in == nil {
		return sdk.Capabilities{}
	}
	return sdk.Capabilities{
		ParkTiers:       in.ParkTiers,
		APIs:            in.Apis,
		AbortMode:       sdk.AbortMode(in.AbortMode),
		IdleSignal:      in.IdleSignal,
		Groups:          in.Groups,
		LMCache:         in.Lmcache,
		RequestIDField:  in.RequestIdField,
		RequestIDHeader: in.RequestIdHeader,
		TierPerPark:     in.TierPerPark,
	}
}

func detectRequestToPB(in *sdk.DetectRequest) *pb.DetectRequest {
	if in == nil {
		return nil
	}
	return &pb.DetectRequest{
		Path:     in.Path,
		Manifest: in.Manifest,
		Name:     in.Name,
	}
}

func detectRequestFromPB(in *pb.DetectRequest) sdk.DetectRequest {
	if in == nil {
		return sdk.DetectRequest{}
	}
	return sdk.DetectRequest{
		Path:     in.Path,
		Manifest: in.Manifest,
		Name:     in.Name,
	}
}

func detectResponseToPB(in *sdk.DetectResponse) *pb.DetectResponse {
	if in == nil {
		return nil
	}
	return &pb.DetectResponse{
		Family:           in.Family,
		Version:          in.Version,
		Verified:         in.Verified,
		Digest:           in.Digest,
		Program:          in.Program,
		ToolchainMissing: in.ToolchainMissing,
		Notes:            in.Notes,
		Details:          in.Details,
	}
}

func detectResponseFromPB(in *pb.DetectResponse) sdk.DetectResponse {
	if in == nil {
		return sdk.DetectResponse{}
	}
	return sdk.DetectResponse{
		Family:           in.Family,
		Version:          in.Version,
		Verified:         in.Verified,
		Digest:           in.Digest,
		Program:          in.Program,
		ToolchainMissing: in.ToolchainMissing,
		Notes:            in.Notes,
		Details:          in.Details,
	}
}

func flagsRequestToPB(in *sdk.FlagsRequest) *pb.FlagsRequest {
	if in == nil {
		return nil
	}
	return &pb.FlagsRequest{
		Version: in.Version,
	}
}

func flagsRequestFromPB(in *pb.FlagsRequest) sdk.FlagsRequest {
	if in == nil {
		return sdk.FlagsRequest{}
	}
	return sdk.FlagsRequest{
		Version: in.Version,
	}
}

func flagRuleToPB(in *sdk.FlagRule) *pb.FlagRule {
	if in == nil {
		return nil
	}
	return &pb.FlagRule{
		Name:     in.Name,
		Kind:     pb.FlagKind(in.Kind),
		Class:    pb.FlagClass(in.Class),
		Reason:   in.Reason,
		Approval: in.Approval,
		Aliases:  in.Aliases,
	}
}

func flagRuleFromPB(in *pb.FlagRule) sdk.FlagRule {
	if in == nil {
		return sdk.FlagRule{}
	}
	return sdk.FlagRule{
		Name:     in.Name,
		Kind:     sdk.FlagKind(in.Kind),
		Class:    sdk.FlagClass(in.Class),
		Reason:   in.Reason,
		Approval: in.Approval,
		Aliases:  in.Aliases,
	}
}

func flagsResponseToPB(in *sdk.FlagsResponse) *pb.FlagsResponse {
	if in == nil {
		return nil
	}
	return &pb.FlagsResponse{
		Family: in.Family,
		Rules:  sliceToPB(in.Rules, flagRuleToPB),
	}
}

func flagsResponseFromPB(in *pb.FlagsResponse) sdk.FlagsResponse {
	if in == nil {
		return sdk.FlagsResponse{}
	}
	return sdk.FlagsResponse{
		Family: in.Family,
		Rules:  sliceFromPB(in.Rules, flagRuleFromPB),
	}
}

func installationToPB(in *sdk.Installation) *pb.Installation {
	if in == nil {
		return nil
	}
	return &pb.Installation{
		Name:     in.Name,
		Family:   in.Family,
		Path:     in.Path,
		Version:  in.Version,
		Verified: in.Verified,
		Digest:   in.Digest,
		Details:  in.Details,
	}
}

func installationFromPB(in *pb.Installation) sdk.Installation {
	if in == nil {
		return sdk.Installation{}
	}
	return sdk.Installation{
		Name:     in.Name,
		Family:   in.Family,
		Path:     in.Path,
		Version:  in.Version,
		Verified: in.Verified,
		Digest:   in.Digest,
		Details:  in.Details,
	}
}

func hostPolicyToPB(in *sdk.HostPolicy) *pb.HostPolicy {
	if in == nil {
		return nil
	}
	return &pb.HostPolicy{
		ApprovedOptions: in.ApprovedOptions,
		ApprovedPaths:   in.ApprovedPaths,
		ApprovedEnv:     in.ApprovedEnv,
		AllowRemoteCode: in.AllowRemoteCode,
		EngineTelemetry: in.EngineTelemetry,
		EngineLogs:      in.EngineLogs,
		Retention:       in.Retention,
		Unified:         in.Unified,
		HostEnv:         in.HostEnv,
		CudaHome:        in.CUDAHome,
		Lmcache:         in.LMCache,
	}
}

func hostPolicyFromPB(in *pb.HostPolicy) sdk.HostPolicy {
	if in == nil {
		return sdk.HostPolicy{}
	}
	return sdk.HostPolicy{
		ApprovedOptions: in.ApprovedOptions,
		ApprovedPaths:   in.ApprovedPaths,
		ApprovedEnv:     in.ApprovedEnv,
		AllowRemoteCode: in.AllowRemoteCode,
		EngineTelemetry: in.EngineTelemetry,
		EngineLogs:      in.EngineLogs,
		Retention:       in.Retention,
		Unified:         in.Unified,
		HostEnv:         in.HostEnv,
		CUDAHome:        in.CudaHome,
		LMCache:         in.Lmcache,
	}
}

func deploymentToPB(in *sdk.Deployment) *pb.Deployment {
	if in == nil {
		return nil
	}
	return &pb.Deployment{
		Name:                  in.Name,
		Revision:              in.Revision,
		Api:                   in.API,
		ServedName:            in.ServedName,
		ModelDir:              in.ModelDir,
		Residency:             in.Residency,
		MaxConcurrentRequests: in.MaxConcurrentRequests,
		ContextLength:         in.ContextLength,
		Dtype:                 in.Dtype,
		Quantization:          in.Quantization,
		KvCacheDtype:          in.KVCacheDtype,
		CudaGraphs:            in.CUDAGraphs,
		TrustRemoteCode:       in.TrustRemoteCode,
		AcceptExtraArgs:       in.AcceptExtraArgs,
		ExtraArgs:             in.ExtraArgs,
		Env:                   in.Env,
		EngineConfigJson:      in.EngineConfigJSON,
		Resources:             valueToPB(&in.Resources, resourcesToPB),
		Memory:                valueToPB(&in.Memory, memorySizesToPB),
		Lmcache:               in.LMCache,
		LmcachePoolBytes:      in.LMCachePoolBytes,
		Group:                 groupToPB(in.Group),
	}
}

func deploymentFromPB(in *pb.Deployment) sdk.Deployment {
	if in == nil {
		return sdk.Deployment{}
	}
	return sdk.Deployment{
		Name:                  in.Name,
		Revision:              in.Revision,
		API:                   in.Api,
		ServedName:            in.ServedName,
		ModelDir:              in.ModelDir,
		Residency:             in.Residency,
		MaxConcurrentRequests: in.MaxConcurrentRequests,
		ContextLength:         in.ContextLength,
		Dtype:                 in.Dtype,
		Quantization:          in.Quantization,
		KVCacheDtype:          in.KvCacheDtype,
		CUDAGraphs:            in.CudaGraphs,
		TrustRemoteCode:       in.TrustRemoteCode,
		AcceptExtraArgs:       in.AcceptExtraArgs,
		ExtraArgs:             in.ExtraArgs,
		Env:                   in.Env,
		EngineConfigJSON:      in.EngineConfigJson,
		Resources:             resourcesFromPB(in.Resources),
		Memory:                memorySizesFromPB(in.Memory),
		LMCache:               in.Lmcache,
		LMCachePoolBytes:      in.LmcachePoolBytes,
		Group:                 ptrFromPB(in.Group, groupFromPB),
	}
}

func groupToPB(in *sdk.Group) *pb.Group {
	if in == nil {
		return nil
	}
	return &pb.Group{
		Rank:             in.Rank,
		Size:             in.Size,
		TensorParallel:   in.TensorParallel,
		PipelineParallel: in.PipelineParallel,
		HeadAddress:      in.HeadAddress,
		RendezvousPort:   in.RendezvousPort,
		PeerAddress:      in.PeerAddress,
		RequireRdma:      in.RequireRDMA,
	}
}

func groupFromPB(in *pb.Group) sdk.Group {
	if in == nil {
		return sdk.Group{}
	}
	return sdk.Group{
		Rank:             in.Rank,
		Size:             in.Size,
		TensorParallel:   in.TensorParallel,
		PipelineParallel: in.PipelineParallel,
		HeadAddress:      in.HeadAddress,
		RendezvousPort:   in.RendezvousPort,
		PeerAddress:      in.PeerAddress,
		RequireRDMA:      in.RequireRdma,
	}
}

func resourcesToPB(in *sdk.Resources) *pb.Resources {
	if in == nil {
		return nil
	}
	return &pb.Resources{
		Declared:    in.Declared,
		DeviceBytes: in.DeviceBytes,
		HostBytes:   in.HostBytes,
	}
}

func resourcesFromPB(in *pb.Resources) sdk.Resources {
	if in == nil {
		return sdk.Resources{}
	}
	return sdk.Resources{
		Declared:    in.Declared,
		DeviceBytes: in.DeviceBytes,
		HostBytes:   in.HostBytes,
	}
}

func memorySizesToPB(in *sdk.MemorySizes) *pb.MemorySizes {
	if in == nil {
		return nil
	}
	return &pb.MemorySizes{
		RequestBytes: in.RequestBytes,
		KvCacheBytes: in.KVCacheBytes,
		StartupBytes: in.StartupBytes,
	}
}

func memorySizesFromPB(in *pb.MemorySizes) sdk.MemorySizes {
	if in == nil {
		return sdk.MemorySizes{}
	}
	return sdk.MemorySizes{
		RequestBytes: in.RequestBytes,
		KVCacheBytes: in.KvCacheBytes,
		StartupBytes: in.StartupBytes,
	}
}

func launchContextToPB(in *sdk.LaunchContext) *pb.LaunchContext {
	if in == nil {
		return nil
	}
	return &pb.LaunchContext{
		Port:             in.Port,
		DeviceUuids:      in.DeviceUUIDs,
		DeviceBytes:      in.DeviceBytes,
		DeviceTotalBytes: in.DeviceTotalBytes,
		KvCacheBytes:     in.KVCacheBytes,
		LaunchDir:        in.LaunchDir,
		InstanceId:       in.InstanceID,
		LaunchId:         in.LaunchID,
		LmcachePort:      in.LMCachePort,
		LmcacheServer:    launchToPB(in.LMCacheServer),
	}
}

func launchContextFromPB(in *pb.LaunchContext) sdk.LaunchContext {
	if in == nil {
		return sdk.LaunchContext{}
	}
	return sdk.LaunchContext{
		Port:             in.Port,
		DeviceUUIDs:      in.DeviceUuids,
		DeviceBytes:      in.DeviceBytes,
		DeviceTotalBytes: in.DeviceTotalBytes,
		KVCacheBytes:     in.KvCacheBytes,
		LaunchDir:        in.LaunchDir,
		InstanceID:       in.InstanceId,
		LaunchID:         in.LaunchId,
		LMCachePort:      in.LmcachePort,
		LMCacheServer:    ptrFromPB(in.LmcacheServer, launchFromPB),
	}
}

func planRequestToPB(in *sdk.PlanRequest) *pb.PlanRequest {
	if in == nil {
		return nil
	}
	return &pb.PlanRequest{
		Installation: valueToPB(&in.Installation, installationToPB),
		Deployment:   valueToPB(&in.Deployment, deploymentToPB),
		Host:         valueToPB(&in.Host, hostPolicyToPB),
		Launch:       valueToPB(&in.Launch, launchContextToPB),
	}
}

func planRequestFromPB(in *pb.PlanRequest) sdk.PlanRequest {
	if in == nil {
		return sdk.PlanRequest{}
	}
	return sdk.PlanRequest{
		Installation: installationFromPB(in.Installation),
		Deployment:   deploymentFromPB(in.Deployment),
		Host:         hostPolicyFromPB(in.Host),
		Launch:       launchContextFromPB(in.Launch),
	}
}

func refusalToPB(in *sdk.Refusal) *pb.Refusal {
	if in == nil {
		return nil
	}
	return &pb.Refusal{
		Code:    in.Code,
		Message: in.Message,
		Field:   in.Field,
	}
}

func refusalFromPB(in *pb.Refusal) sdk.Refusal {
	if in == nil {
		return sdk.Refusal{}
	}
	return sdk.Refusal{
		Code:    in.Code,
		Message: in.Message,
		Field:   in.Field,
	}
}

func memoryHintsToPB(in *sdk.MemoryHints) *pb.MemoryHints {
	if in == nil {
		return nil
	}
	return &pb.MemoryHints{
		WeightsBytes:          in.WeightsBytes,
		KvBytesPerToken:       in.KVBytesPerToken,
		KvCacheBytes:          in.KVCacheBytes,
		ReadyDeviceBytes:      in.ReadyDeviceBytes,
		ReadyHostBytes:        in.ReadyHostBytes,
		StartupDeviceBytes:    in.StartupDeviceBytes,
		ContextLength:         in.ContextLength,
		MaxConcurrentRequests: in.MaxConcurrentRequests,
		Source:                in.Source,
		BesideHostBytes:       in.BesideHostBytes,
	}
}

func memoryHintsFromPB(in *pb.MemoryHints) sdk.MemoryHints {
	if in == nil {
		return sdk.MemoryHints{}
	}
	return sdk.MemoryHints{
		WeightsBytes:          in.WeightsBytes,
		KVBytesPerToken:       in.KvBytesPerToken,
		KVCacheBytes:          in.KvCacheBytes,
		ReadyDeviceBytes:      in.ReadyDeviceBytes,
		ReadyHostBytes:        in.ReadyHostBytes,
		StartupDeviceBytes:    in.StartupDeviceBytes,
		ContextLength:         in.ContextLength,
		MaxConcurrentRequests: in.MaxConcurrentRequests,
		Source:                in.Source,
		BesideHostBytes:       in.BesideHostBytes,
	}
}

func parsersToPB(in *sdk.Parsers) *pb.Parsers {
	if in == nil {
		return nil
	}
	return &pb.Parsers{
		ToolCall:   in.ToolCall,
		Reasoning:  in.Reasoning,
		Provenance: in.Provenance,
	}
}

func parsersFromPB(in *pb.Parsers) sdk.Parsers {
	if in == nil {
		return sdk.Parsers{}
	}
	return sdk.Parsers{
		ToolCall:   in.ToolCall,
		Reasoning:  in.Reasoning,
		Provenance: in.Provenance,
	}
}

func planResponseToPB(in *sdk.PlanResponse) *pb.PlanResponse {
	if in == nil {
		return nil
	}
	return &pb.PlanResponse{
		Refusals:         sliceToPB(in.Refusals, refusalToPB),
		Argv:             in.Argv,
		Env:              in.Env,
		Workdir:          in.Workdir,
		Hints:            valueToPB(&in.Hints, memoryHintsToPB),
		Parsers:          valueToPB(&in.Parsers, parsersToPB),
		Residency:        in.Residency,
		StartupTimeoutMs: in.StartupTimeout.Milliseconds(),
		WakeTimeoutMs:    in.WakeTimeout.Milliseconds(),
		Notes:            in.Notes,
		Lmcache:          valueToPB(&in.LMCache, lMCachePlanToPB),
	}
}

func planResponseFromPB(in *pb.PlanResponse) sdk.PlanResponse {
	if in == nil {
		return sdk.PlanResponse{}
	}
	return sdk.PlanResponse{
		Refusals:       sliceFromPB(in.Refusals, refusalFromPB),
		Argv:           in.Argv,
		Env:            in.Env,
		Workdir:        in.Workdir,
		Hints:          memoryHintsFromPB(in.Hints),
		Parsers:        parsersFromPB(in.Parsers),
		Residency:      in.Residency,
		StartupTimeout: time.Duration(in.StartupTimeoutMs) * time.Millisecond,
		WakeTimeout:    time.Duration(in.WakeTimeoutMs) * time.Millisecond,
		Notes:          in.Notes,
		LMCache:        lMCachePlanFromPB(in.Lmcache),
	}
}

func lMCachePlanToPB(in *sdk.LMCachePlan) *pb.LMCachePlan {
	if in == nil {
		return nil
	}
	return &pb.LMCachePlan{
		Runs:        in.Runs,
		Reason:      in.Reason,
		PoolBytes:   in.PoolBytes,
		ServerBytes: in.ServerBytes,
		Argv:        in.Argv,
		Env:         in.Env,
	}
}

func lMCachePlanFromPB(in *pb.LMCachePlan) sdk.LMCachePlan {
	if in == nil {
		return sdk.LMCachePlan{}
	}
	return sdk.LMCachePlan{
		Runs:        in.Runs,
		Reason:      in.Reason,
		PoolBytes:   in.PoolBytes,
		ServerBytes: in.ServerBytes,
		Argv:        in.Argv,
		Env:         in.Env,
	}
}

func startRequestToPB(in *sdk.StartRequest) *pb.StartRequest {
	if in == nil {
		return nil
	}
	return &pb.StartRequest{
		Installation: valueToPB(&in.Installation, installationToPB),
		Deployment:   valueToPB(&in.Deployment, deploymentToPB),
		Host:         valueToPB(&in.Host, hostPolicyToPB),
		Launch:       valueToPB(&in.Launch, launchContextToPB),
		Plan:         valueToPB(&in.Plan, planResponseToPB),
		EngineKey:    in.EngineKey,
		AdminKey:     in.AdminKey,
	}
}

func startRequestFromPB(in *pb.StartRequest) sdk.StartRequest {
	if in == nil {
		return sdk.StartRequest{}
	}
	return sdk.StartRequest{
		Installation: installationFromPB(in.Installation),
		Deployment:   deploymentFromPB(in.Deployment),
		Host:         hostPolicyFromPB(in.Host),
		Launch:       launchContextFromPB(in.Launch),
		Plan:         planResponseFromPB(in.Plan),
		EngineKey:    in.EngineKey,
		AdminKey:     in.AdminKey,
	}
}

func processIdentityToPB(in *sdk.ProcessIdentity) *pb.ProcessIdentity {
	if in == nil {
		return nil
	}
	return &pb.ProcessIdentity{
		Pid:        in.Pid,
		StartTicks: in.StartTicks,
		Role:       in.Role,
	}
}

func processIdentityFromPB(in *pb.ProcessIdentity) sdk.ProcessIdentity {
	if in == nil {
		return sdk.ProcessIdentity{}
	}
	return sdk.ProcessIdentity{
		Pid:        in.Pid,
		StartTicks: in.StartTicks,
		Role:       in.Role,
	}
}

func launchToPB(in *sdk.Launch) *pb.Launch {
	if in == nil {
		return nil
	}
	return &pb.Launch{
		Pgid:        in.Pgid,
		Processes:   sliceToPB(in.Processes, processIdentityToPB),
		LaunchDir:   in.LaunchDir,
		Port:        in.Port,
		LaunchId:    in.LaunchID,
		LmcachePort: in.LMCachePort,
	}
}

func launchFromPB(in *pb.Launch) sdk.Launch {
	if in == nil {
		return sdk.Launch{}
	}
	return sdk.Launch{
		Pgid:        in.Pgid,
		Processes:   sliceFromPB(in.Processes, processIdentityFromPB),
		LaunchDir:   in.LaunchDir,
		Port:        in.Port,
		LaunchID:    in.LaunchId,
		LMCachePort: in.LmcachePort,
	}
}

func endpointToPB(in *sdk.Endpoint) *pb.Endpoint {
	if in == nil {
		return nil
	}
	return &pb.Endpoint{
		BaseUrl:           in.BaseURL,
		AuthHeader:        in.AuthHeader,
		AuthValue:         in.AuthValue,
		ChatPath:          in.ChatPath,
		DecisionsPath:     in.DecisionsPath,
		RequestIdField:    in.RequestIDField,
		RequestIdHeader:   in.RequestIDHeader,
		AbortMode:         pb.AbortMode(in.AbortMode),
		ServedName:        in.ServedName,
		Listener:          in.Listener,
		OpenRoutes:        in.OpenRoutes,
		ExposureNote:      in.ExposureNote,
		NonStreamedHangup: pb.NonStreamedHangup(in.NonStreamedHangup),
		CompletionsPath:   in.CompletionsPath,
		CacheSalt:         in.CacheSalt,
		MessagesPath:      in.MessagesPath,
		CountTokensPath:   in.CountTokensPath,
		ResponsesPath:     in.ResponsesPath,
	}
}

func endpointFromPB(in *pb.Endpoint) sdk.Endpoint {
	if in == nil {
		return sdk.Endpoint{}
	}
	return sdk.Endpoint{
		BaseURL:           in.BaseUrl,
		AuthHeader:        in.AuthHeader,
		AuthValue:         in.AuthValue,
		ChatPath:          in.ChatPath,
		DecisionsPath:     in.DecisionsPath,
		RequestIDField:    in.RequestIdField,
		RequestIDHeader:   in.RequestIdHeader,
		AbortMode:         sdk.AbortMode(in.AbortMode),
		ServedName:        in.ServedName,
		Listener:          in.Listener,
		OpenRoutes:        in.OpenRoutes,
		ExposureNote:      in.ExposureNote,
		NonStreamedHangup: sdk.NonStreamedHangup(in.NonStreamedHangup),
		CompletionsPath:   in.CompletionsPath,
		CacheSalt:         in.CacheSalt,
		MessagesPath:      in.MessagesPath,
		CountTokensPath:   in.CountTokensPath,
		ResponsesPath:     in.ResponsesPath,
	}
}

func startResponseToPB(in *sdk.StartResponse) *pb.StartResponse {
	if in == nil {
		return nil
	}
	return &pb.StartResponse{
		Launch:        valueToPB(&in.Launch, launchToPB),
		Endpoint:      valueToPB(&in.Endpoint, endpointToPB),
		LmcacheServer: launchToPB(in.LMCacheServer),
	}
}

func startResponseFromPB(in *pb.StartResponse) sdk.StartResponse {
	if in == nil {
		return sdk.StartResponse{}
	}
	return sdk.StartResponse{
		Launch:        launchFromPB(in.Launch),
		Endpoint:      endpointFromPB(in.Endpoint),
		LMCacheServer: ptrFromPB(in.LmcacheServer, launchFromPB),
	}
}

func probeRequestToPB(in *sdk.ProbeRequest) *pb.ProbeRequest {
	if in == nil {
		return nil
	}
	return &pb.ProbeRequest{
		InstanceId: in.InstanceID,
		Kind:       pb.ProbeKind(in.Kind),
		DeadlineMs: in.Deadline.Milliseconds(),
	}
}

func probeRequestFromPB(in *pb.ProbeRequest) sdk.ProbeRequest {
	if in == nil {
		return sdk.ProbeRequest{}
	}
	return sdk.ProbeRequest{
		InstanceID: in.InstanceId,
		Kind:       sdk.ProbeKind(in.Kind),
		Deadline:   time.Duration(in.DeadlineMs) * time.Millisecond,
	}
}

func probeResponseToPB(in *sdk.ProbeResponse) *pb.ProbeResponse {
	if in == nil {
		return nil
	}
	return &pb.ProbeResponse{
		Alive:        in.Alive,
		Ready:        in.Ready,
		Exited:       in.Exited,
		ExitCode:     in.ExitCode,
		Detail:       in.Detail,
		LastLogLines: in.LastLogLines,
		Endpoint:     valueToPB(&in.Endpoint, endpointToPB),
		Canary:       in.Canary,
		Code:         in.Code,
	}
}

func probeResponseFromPB(in *pb.ProbeResponse) sdk.ProbeResponse {
	if in == nil {
		return sdk.ProbeResponse{}
	}
	return sdk.ProbeResponse{
		Alive:        in.Alive,
		Ready:        in.Ready,
		Exited:       in.Exited,
		ExitCode:     in.ExitCode,
		Detail:       in.Detail,
		LastLogLines: in.LastLogLines,
		Endpoint:     endpointFromPB(in.Endpoint),
		Canary:       in.Canary,
		Code:         in.Code,
	}
}

func parkRequestToPB(in *sdk.ParkRequest) *pb.ParkRequest {
	if in == nil {
		return nil
	}
	return &pb.ParkRequest{
		InstanceId: in.InstanceID,
		Tier:       in.Tier,
	}
}

func parkRequestFromPB(in *pb.ParkRequest) sdk.ParkRequest {
	if in == nil {
		return sdk.ParkRequest{}
	}
	return sdk.ParkRequest{
		InstanceID: in.InstanceId,
		Tier:       in.Tier,
	}
}

func parkResponseToPB(in *sdk.ParkResponse) *pb.ParkResponse {
	if in == nil {
		return nil
	}
	return &pb.ParkResponse{
		Detail:       in.Detail,
		ResidueBytes: in.ResidueBytes,
	}
}

func parkResponseFromPB(in *pb.ParkResponse) sdk.ParkResponse {
	if in == nil {
		return sdk.ParkResponse{}
	}
	return sdk.ParkResponse{
		Detail:       in.Detail,
		ResidueBytes: in.ResidueBytes,
	}
}

func wakeRequestToPB(in *sdk.WakeRequest) *pb.WakeRequest {
	if in == nil {
		return nil
	}
	return &pb.WakeRequest{
		InstanceId: in.InstanceID,
		Tier:       in.Tier,
	}
}

func wakeRequestFromPB(in *pb.WakeRequest) sdk.WakeRequest {
	if in == nil {
		return sdk.WakeRequest{}
	}
	return sdk.WakeRequest{
		InstanceID: in.InstanceId,
		Tier:       in.Tier,
	}
}

func wakeResponseToPB(in *sdk.WakeResponse) *pb.WakeResponse {
	if in == nil {
		return nil
	}
	return &pb.WakeResponse{
		Canary: in.Canary,
		Detail: in.Detail,
	}
}

func wakeResponseFromPB(in *pb.WakeResponse) sdk.WakeResponse {
	if in == nil {
		return sdk.WakeResponse{}
	}
	return sdk.WakeResponse{
		Canary: in.Canary,
		Detail: in.Detail,
	}
}

func abortRequestToPB(in *sdk.AbortRequest) *pb.AbortRequest {
	if in == nil {
		return nil
	}
	return &pb.AbortRequest{
		InstanceId: in.InstanceID,
		RequestId:  in.RequestID,
	}
}

func abortRequestFromPB(in *pb.AbortRequest) sdk.AbortRequest {
	if in == nil {
		return sdk.AbortRequest{}
	}
	return sdk.AbortRequest{
		InstanceID: in.InstanceId,
		RequestID:  in.RequestId,
	}
}

func abortResponseToPB(in *sdk.AbortResponse) *pb.AbortResponse {
	if in == nil {
		return nil
	}
	return &pb.AbortResponse{
		Mode: pb.AbortMode(in.Mode),
		Sent: in.Sent,
	}
}

func abortResponseFromPB(in *pb.AbortResponse) sdk.AbortResponse {
	if in == nil {
		return sdk.AbortResponse{}
	}
	return sdk.AbortResponse{
		Mode: sdk.AbortMode(in.Mode),
		Sent: in.Sent,
	}
}

func loadRequestToPB(in *sdk.LoadRequest) *pb.LoadRequest {
	if in == nil {
		return nil
	}
	return &pb.LoadRequest{
		InstanceId: in.InstanceID,
	}
}

func loadRequestFromPB(in *pb.LoadRequest) sdk.LoadRequest {
	if in == nil {
		return sdk.LoadRequest{}
	}
	return sdk.LoadRequest{
		InstanceID: in.InstanceId,
	}
}

func loadResponseToPB(in *sdk.LoadResponse) *pb.LoadResponse {
	if in == nil {
		return nil
	}
	return &pb.LoadResponse{
		Known:   in.Known,
		Running: in.Running,
		Waiting: in.Waiting,
		KvUsage: in.KVUsage,
		Figures: in.Figures,
	}
}

func loadResponseFromPB(in *pb.LoadResponse) sdk.LoadResponse {
	if in == nil {
		return sdk.LoadResponse{}
	}
	return sdk.LoadResponse{
		Known:   in.Known,
		Running: in.Running,
		Waiting: in.Waiting,
		KVUsage: in.KvUsage,
		Figures: in.Figures,
	}
}

func stopRequestToPB(in *sdk.StopRequest) *pb.StopRequest {
	if in == nil {
		return nil
	}
	return &pb.StopRequest{
		InstanceId:    in.InstanceID,
		GraceMs:       in.Grace.Milliseconds(),
		Launch:        launchToPB(in.Launch),
		LmcacheServer: launchToPB(in.LMCacheServer),
	}
}

func stopRequestFromPB(in *pb.StopRequest) sdk.StopRequest {
	if in == nil {
		return sdk.StopRequest{}
	}
	return sdk.StopRequest{
		InstanceID:    in.InstanceId,
		Grace:         time.Duration(in.GraceMs) * time.Millisecond,
		Launch:        ptrFromPB(in.Launch, launchFromPB),
		LMCacheServer: ptrFromPB(in.LmcacheServer, launchFromPB),
	}
}

func stopResponseToPB(in *sdk.StopResponse) *pb.StopResponse {
	if in == nil {
		return nil
	}
	return &pb.StopResponse{
		Gone:     in.Gone,
		Forced:   in.Forced,
		ExitCode: in.ExitCode,
		Cleaned:  in.Cleaned,
		Detail:   in.Detail,
	}
}

func stopResponseFromPB(in *pb.StopResponse) sdk.StopResponse {
	if in == nil {
		return sdk.StopResponse{}
	}
	return sdk.StopResponse{
		Gone:     in.Gone,
		Forced:   in.Forced,
		ExitCode: in.ExitCode,
		Cleaned:  in.Cleaned,
		Detail:   in.Detail,
	}
}

func recoverRequestToPB(in *sdk.RecoverRequest) *pb.RecoverRequest {
	if in == nil {
		return nil
	}
	return &pb.RecoverRequest{
		InstanceId:    in.InstanceID,
		Launch:        valueToPB(&in.Launch, launchToPB),
		Installation:  valueToPB(&in.Installation, installationToPB),
		Deployment:    valueToPB(&in.Deployment, deploymentToPB),
		Host:          valueToPB(&in.Host, hostPolicyToPB),
		Context:       valueToPB(&in.Context, launchContextToPB),
		EngineKey:     in.EngineKey,
		AdminKey:      in.AdminKey,
		RecordedState: in.RecordedState,
		ParkTier:      in.ParkTier,
	}
}

func recoverRequestFromPB(in *pb.RecoverRequest) sdk.RecoverRequest {
	if in == nil {
		return sdk.RecoverRequest{}
	}
	return sdk.RecoverRequest{
		InstanceID:    in.InstanceId,
		Launch:        launchFromPB(in.Launch),
		Installation:  installationFromPB(in.Installation),
		Deployment:    deploymentFromPB(in.Deployment),
		Host:          hostPolicyFromPB(in.Host),
		Context:       launchContextFromPB(in.Context),
		EngineKey:     in.EngineKey,
		AdminKey:      in.AdminKey,
		RecordedState: in.RecordedState,
		ParkTier:      in.ParkTier,
	}
}

func recoverResponseToPB(in *sdk.RecoverResponse) *pb.RecoverResponse {
	if in == nil {
		return nil
	}
	return &pb.RecoverResponse{
		State:    pb.RecoverState(in.State),
		Endpoint: valueToPB(&in.Endpoint, endpointToPB),
		Detail:   in.Detail,
		Parked:   in.Parked,
		Launch:   valueToPB(&in.Launch, launchToPB),
	}
}

func recoverResponseFromPB(in *pb.RecoverResponse) sdk.RecoverResponse {
	if in == nil {
		return sdk.RecoverResponse{}
	}
	return sdk.RecoverResponse{
		State:    sdk.RecoverState(in.State),
		Endpoint: endpointFromPB(in.Endpoint),
		Detail:   in.Detail,
		Parked:   in.Parked,
		Launch:   launchFromPB(in.Launch),
	}
}

func logsRequestToPB(in *sdk.LogsRequest) *pb.LogsRequest {
	if in == nil {
		return nil
	}
	return &pb.LogsRequest{
		InstanceId: in.InstanceID,
		MaxBytes:   in.MaxBytes,
		LaunchDir:  in.LaunchDir,
	}
}

func logsRequestFromPB(in *pb.LogsRequest) sdk.LogsRequest {
	if in == nil {
		return sdk.LogsRequest{}
	}
	return sdk.LogsRequest{
		InstanceID: in.InstanceId,
		MaxBytes:   in.MaxBytes,
		LaunchDir:  in.LaunchDir,
	}
}

func logsResponseToPB(in *sdk.LogsResponse) *pb.LogsResponse {
	if in == nil {
		return nil
	}
	return &pb.LogsResponse{
		Text:      in.Text,
		Truncated: in.Truncated,
	}
}

func logsResponseFromPB(in *pb.LogsResponse) sdk.LogsResponse {
	if in == nil {
		return sdk.LogsResponse{}
	}
	return sdk.LogsResponse{
		Text:      in.Text,
		Truncated: in.Truncated,
	}
}

func waitExitRequestToPB(in *sdk.WaitExitRequest) *pb.WaitExitRequest {
	if in == nil {
		return nil
	}
	return &pb.WaitExitRequest{
		InstanceId: in.InstanceID,
	}
}

func waitExitRequestFromPB(in *pb.WaitExitRequest) sdk.WaitExitRequest {
	if in == nil {
		return sdk.WaitExitRequest{}
	}
	return sdk.WaitExitRequest{
		InstanceID: in.InstanceId,
	}
}

func exitEventToPB(in *sdk.ExitEvent) *pb.ExitEvent {
	if in == nil {
		return nil
	}
	return &pb.ExitEvent{
		Exited:       in.Exited,
		ExitCode:     in.ExitCode,
		Detail:       in.Detail,
		LastLogLines: in.LastLogLines,
	}
}

func exitEventFromPB(in *pb.ExitEvent) sdk.ExitEvent {
	if in == nil {
		return sdk.ExitEvent{}
	}
	return sdk.ExitEvent{
		Exited:       in.Exited,
		ExitCode:     in.ExitCode,
		Detail:       in.Detail,
		LastLogLines: in.LastLogLines,
	}
}

// valueToPB converts a message the Go type holds by value; a zero value
// goes as an absent message, as the core sent an unset one before the Go
// types existed.
func valueToPB[G any, P any](in *G, conv func(*G) *P) *P {
	if reflect.ValueOf(in).Elem().IsZero() {
		return nil
	}
	return conv(in)
}

// ptrFromPB converts a message the Go type holds by pointer: nil when
// absent.
func ptrFromPB[P any, G any](in *P, conv func(*P) G) *G {
	if in == nil {
		return nil
	}
	out := conv(in)
	return &out
}

func sliceToPB[G any, P any](in []*G, conv func(*G) *P) []*P {
	if in == nil {
		return nil
	}
	out := make([]*P, len(in))
	for i, v := range in {
		out[i] = conv(v)
	}
	return out
}

func sliceFromPB[P any, G any](in []*P, conv func(*P) G) []*G {
	if in == nil {
		return nil
	}
	out := make([]*G, len(in))
	for i, v := range in {
		out[i] = ptrFromPB(v, conv)
	}
	return out
}
