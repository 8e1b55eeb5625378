// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"context"
	"fmt"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/core/agent"
	"github.com/capyctl/capyctl/core/structs"
)

// ModelPullCommand downloads a Hugging Face repository into the models
// root.
type ModelPullCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *ModelPullCommand) Synopsis() string {
	return "Download a Hugging Face model into the models root"
}

// Help implements cli.Command.
func (c *ModelPullCommand) Help() string {
	return `Usage: capyctl model pull <org/name> [options]

  Downloads a Hugging Face repository revision into the models root
  (<models_root>/sources/huggingface/<org>/<name>/<commit>), from
  $HF_ENDPOINT (default https://huggingface.co) with $HF_TOKEN when set.
  It needs no running role (an offline command: the files land where a
  role on this machine looks for them). A pull that is interrupted keeps
  what it fetched: pull again and it
  resumes where it stopped. Every file is checked against the hub's size
  and digest. A deployment with model { hf = "org/name" } uses the copy,
  and downloads it on its first start when there is none.

  Exit codes: 0 downloaded, 2 bad arguments or unknown repository,
  13 the download failed (pull again to resume).

Options:

  --revision REV      A branch, tag or 40-hex commit (default main).
  --models-root DIR   The models root (default $CAPYCTL_MODELS_ROOT or
                      ~/models).

` + GeneralOptions
}

// Run implements cli.Command.
func (c *ModelPullCommand) Run(args []string) int {
	fs := c.FlagSet("model pull")
	revision := fs.String("revision", "", "")
	root := fs.String("models-root", "", "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl model pull <org/name> [--revision REV]")
	}
	if *root == "" {
		*root = c.Getenv("CAPYCTL_MODELS_ROOT")
	}
	if *root == "" {
		*root = "~/models"
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	bar := newProgressBar(c.Meta, !c.JSON() && isTerminal(c.Err))
	dir, err := agent.PullModel(ctx, agent.PullOptions{Root: *root, Getenv: c.Getenv}, rest[0], *revision, bar.update)
	bar.finish(err == nil)
	if err != nil {
		return c.Fail(err)
	}
	if *revision == "" {
		*revision = "main"
	}
	if c.JSON() {
		c.PrintJSON(map[string]any{"repo": rest[0], "revision": *revision, "commit": bar.last.Commit, "dir": dir, "bytes": bar.last.Total, "files": bar.last.Files})
		return 0
	}
	fmt.Fprintf(c.Out, "Downloaded %s at %s (%d files, %s) into %s\n", rest[0], shortCommit(bar.last.Commit), bar.last.Files, humanBytes(bar.last.Total), dir)
	fmt.Fprintf(c.Out, "Deploy it with: model { hf = %q }\n", rest[0])
	return 0
}

// progressBar draws a pull's progress on stderr: a bar redrawn in place on
// a terminal, a line per file otherwise.
type progressBar struct {
	m     *Meta
	tty   bool
	last  agent.PullProgress
	drawn time.Time
	file  string
}

func newProgressBar(m *Meta, tty bool) *progressBar { return &progressBar{m: m, tty: tty} }

// update is the pull's progress callback.
func (b *progressBar) update(p agent.PullProgress) {
	prev := b.last
	b.last = p
	if b.m.JSON() {
		return
	}
	if !b.tty {
		if p.File != "" && p.File != b.file {
			b.file = p.File
			resumed := ""
			if p.Resumed {
				resumed = fmt.Sprintf(" (resuming at %s)", humanBytes(p.FileDone))
			}
			fmt.Fprintf(b.m.Err, "fetching %s (%s)%s\n", p.File, humanBytes(p.FileSize), resumed)
		} else if p.Resumed && !prev.Resumed && p.File == prev.File {
			fmt.Fprintf(b.m.Err, "resuming %s at %s\n", p.File, humanBytes(p.FileDone))
		}
		return
	}
	if time.Since(b.drawn) < 100*time.Millisecond && p.File == prev.File && p.Done != p.Total {
		return
	}
	b.drawn = time.Now()
	b.draw(p)
}

// draw renders one line of the bar.
func (b *progressBar) draw(p agent.PullProgress) {
	const width = 30
	frac := 0.0
	if p.Total > 0 {
		frac = float64(p.Done) / float64(p.Total)
	}
	if frac > 1 {
		frac = 1
	}
	filled := int(frac * width)
	bar := strings.Repeat("=", filled)
	if filled < width {
		bar += ">" + strings.Repeat(" ", width-filled-1)
	}
	name := string(escapeTerminal([]byte(p.File))) // a repository's file name: the bar itself is written raw
	if len(name) > 40 {
		name = "…" + name[len(name)-39:]
	}
	fmt.Fprintf(rawOutput(b.m.Err), "\r[%s] %3.0f%% %s/%s  %d/%d files  %s\x1b[K", bar, frac*100, humanBytes(p.Done), humanBytes(p.Total), p.FilesDone, p.Files, name)
}

// finish ends the bar's line.
func (b *progressBar) finish(ok bool) {
	if b.tty && !b.m.JSON() {
		if ok {
			b.draw(b.last)
		}
		fmt.Fprintln(b.m.Err)
	}
}

// humanBytes writes a size with a binary unit.
func humanBytes(n int64) string {
	if n < 0 {
		return "unknown size"
	}
	return structs.FormatBytes(n)
}

// shortCommit is the first 12 digits of a commit.
func shortCommit(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}
