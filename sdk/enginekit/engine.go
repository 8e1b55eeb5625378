// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginekit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/flags"
)

// Residencies.
const (
	ResidencyDeep        = "deep"
	ResidencyHostBacked  = "host_backed"
	ResidencyRestartOnly = "restart_only"
)

// Parks reports whether a residency parks (keeps the process, frees the
// card).
func Parks(residency string) bool {
	return residency == ResidencyDeep || residency == ResidencyHostBacked
}

// Catalogue codes the drivers return besides the SDK's and the flag
// table's.
const (
	// CodeEngineUnsupported is an installation that is not the driver's
	// family: the core then asks the next family.
	CodeEngineUnsupported = "engine_unsupported"
	// CodeInstallationDrift is an installation that changed since it was
	// registered.
	CodeInstallationDrift = "installation_drift"
	// CodeCapabilityMissing, followed by ":<capability>", is a deployment
	// that needs what the engine lacks.
	CodeCapabilityMissing = "capability_missing"
	// CodeHostBackedUnavailable is host_backed on a host with unified
	// memory.
	CodeHostBackedUnavailable = "host_backed_unavailable"
	// CodeLMCacheUnavailable, followed by ":" and the reason's key, is
	// lmcache = "required" where the instance cannot run its LMCache.
	CodeLMCacheUnavailable = "lmcache_unavailable"
	// CodeUnknownConfigKey, followed by ":" and the key, is a key the family's
	// engine_config block does not have.
	CodeUnknownConfigKey = "unknown_config_key"
	// CodeCheckpointUnusable is a model directory the engine cannot load.
	CodeCheckpointUnusable = "checkpoint_unusable"
	// CodePortConflict is a leased port another process listens on.
	CodePortConflict = "port_conflict"
)

// Refusals collects Plan refusals.
type Refusals []*sdk.Refusal

// Add appends a refusal.
func (r *Refusals) Add(code, field, format string, args ...any) {
	*r = append(*r, &sdk.Refusal{Code: code, Field: field, Message: fmt.Sprintf(format, args...)})
}

// Violations appends flag violations.
func (r *Refusals) Violations(vs []flags.Violation) { *r = append(*r, flags.Refusals(vs)...) }

// CheckOptions checks a deployment's options against the driver's flag
// table: extra_args need accept_extra_args and pass the table, and so does
// engine_config.env. typed maps each job-spec field the deployment sets to
// true (Rule.Field). It returns extra_args parsed.
func CheckOptions(t *flags.Table, dep *sdk.Deployment, host *sdk.HostPolicy, typed map[string]bool, r *Refusals) []flags.Arg {
	ap := flags.HostApprovals(host)
	if len(dep.ExtraArgs) > 0 && !dep.AcceptExtraArgs {
		r.Add(flags.CodeExtraArgsRefused, flags.FieldExtraArgs, "extra_args need engine_config.accept_extra_args = true")
	}
	args, vs := t.CheckArgs(dep.ExtraArgs, ap, typed)
	r.Violations(vs)
	r.Violations(t.CheckEnv(dep.Env, ap))
	return args
}

// Describe is a driver's Describe answer: its family, the driver's own
// version, the protocol this SDK serves (sdk.ProtocolVersion), its
// capabilities and the schema of its engine_config block ("" when it has
// none). A nil caps declares none.
func Describe(family, version string, caps *sdk.Capabilities, configSchema string) *sdk.DescribeResponse {
	resp := &sdk.DescribeResponse{
		Name:         family,
		Version:      version,
		Protocol:     sdk.ProtocolVersion,
		ConfigSchema: configSchema,
	}
	if caps != nil {
		resp.Capabilities = *caps
	}
	return resp
}

// RestartOnly is embedded by the drivers of engines that cannot release
// their memory while they run (the core stops them instead of parking) and
// whose requests end when their connection closes: Park and Wake are not
// supported, and Abort has nothing to send.
type RestartOnly struct{}

// Park implements sdk.Driver: nothing parks.
func (RestartOnly) Park(context.Context, *sdk.ParkRequest) (*sdk.ParkResponse, error) {
	return nil, sdk.ErrNotSupported
}

// Wake implements sdk.Driver: nothing parks, nothing wakes.
func (RestartOnly) Wake(context.Context, *sdk.WakeRequest) (*sdk.WakeResponse, error) {
	return nil, sdk.ErrNotSupported
}

// Abort implements sdk.Driver: closing the connection stops the request.
func (RestartOnly) Abort(context.Context, *sdk.AbortRequest) (*sdk.AbortResponse, error) {
	return &sdk.AbortResponse{Mode: sdk.AbortModeCloseConnection}, nil
}

// FileDigest is "sha256:<hex>" of a file's content (an engine's binary).
// A digest is computed once per version of the file: it is kept with the
// file's device, inode, size, modification and change times, and read
// again only when one of them differs. Any write to the file, a rename
// over it or a chmod moves its change time, which no user can set back, so
// a changed binary is never taken for the pinned one; hashing a 10 MiB
// binary on every start cost 25 ms of every cold start.
func FileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	key, keyed := statKey(f)
	if keyed {
		if d, ok := digests.Load(key); ok {
			return d.(string), nil
		}
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	d := "sha256:" + hex.EncodeToString(h.Sum(nil))
	// A file changed moments ago may change again within the kernel's
	// timestamp granularity without its times moving ("racy git"): keep
	// only digests of files older than racyWindow.
	if after, ok := statKey(f); keyed && ok && after == key && time.Since(time.Unix(0, key.ctime)) > racyWindow {
		digests.Store(key, d)
	}
	return d, nil
}

// racyWindow: a file changed this recently is hashed on every call.
var racyWindow = 2 * time.Second

// digests caches FileDigest by fileVersion.
var digests sync.Map

// fileVersion is what identifies one version of a file's content.
type fileVersion struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64
}

// UnwrapPathErr is the cause of a path error without the path, which the
// message names already.
func UnwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
