// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"

	"github.com/capyctl/capyctl/core/models"
)

// PullProgress is a model download's progress (files and bytes so far).
type PullProgress = models.Progress

// PullOptions say where a model download goes.
type PullOptions struct {
	// Root is the models root ("~/models" is expanded).
	Root string
	// Getenv reads HF_ENDPOINT and HF_TOKEN (os.Getenv when nil).
	Getenv func(string) string
}

// PullModel downloads a Hugging Face repository revision into the models
// root, as a role does on a deployment's first start. It needs no running
// role (`capyctl model pull` is an offline command): the files land where
// a role on this machine looks for them.
func PullModel(ctx context.Context, opts PullOptions, repo, revision string, progress func(PullProgress)) (string, error) {
	st := models.NewStore(models.Options{Root: opts.Root, Getenv: opts.Getenv})
	return st.Pull(ctx, repo, revision, progress)
}
