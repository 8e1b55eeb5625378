// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// exampleLine is one capyctl command line written in a file under configs/.
type exampleLine struct {
	where string
	words []string
	// whole is true when the words are the whole command (an example line,
	// or a quoted one); prose that names a command mid-sentence is checked
	// for its command and options only.
	whole bool
}

var (
	placeholder = regexp.MustCompile(`<[^>]*>`)
	// capyctl followed by its words: at a word's start, or after a bin/
	// directory (ExecStart=/usr/local/bin/capyctl ...).
	capyctlAt = regexp.MustCompile("(^|[\\s`\"'(=]|bin/)capyctl +([^\\s].*)$")
)

// configExamples extracts every capyctl command line from the files under
// configs/.
func configExamples(t *testing.T) []exampleLine {
	t.Helper()
	root := filepath.Join("..", "..", "..", "configs")
	var out []exampleLine
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			m := capyctlAt.FindStringSubmatchIndex(line)
			if m == nil {
				continue
			}
			rest := placeholder.ReplaceAllString(line[m[4]:], "PLACEHOLDER")
			whole := strings.HasPrefix(strings.TrimSpace(strings.TrimLeft(line, "#/ ")), "capyctl ") ||
				strings.HasPrefix(strings.TrimSpace(line), "ExecStart=")
			if q := line[m[2]:m[3]]; q == "`" || q == `"` || q == "'" {
				if i := strings.Index(rest, q); i >= 0 {
					rest, whole = rest[:i], true
				}
			}
			var words []string
			for _, w := range strings.Fields(rest) {
				words = append(words, strings.TrimRight(w, ".,;:)"))
			}
			out = append(out, exampleLine{where: filepath.Join("configs", strings.TrimPrefix(path, root+string(filepath.Separator))) + ":" + strconv.Itoa(n), words: words, whole: whole})
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// usage is what a command's help says it takes: its options (and whether
// each takes a value) and how many positional arguments.
type usage struct {
	options     map[string]bool // name -> takes a value
	positionals int
}

var optionLine = regexp.MustCompile(`^\s+(-{1,2}[a-z][a-z0-9-]*)(?:[ =]([A-Z][A-Z0-9_]*|<[^>]*>|PLACEHOLDER))?(\s|$)`)

func parseUsage(help string) usage {
	u := usage{options: map[string]bool{}}
	for i, line := range strings.Split(help, "\n") {
		if i == 0 && strings.HasPrefix(line, "Usage:") {
			// The usage line names options too ([--config FILE]).
			prevFlag := ""
			for _, w := range strings.Fields(line) {
				w = strings.Trim(w, "[]|")
				switch {
				case strings.HasPrefix(w, "-"):
					prevFlag = strings.TrimLeft(w, "-")
					u.options[prevFlag] = false
				case prevFlag != "" && (w == "PLACEHOLDER" || w == strings.ToUpper(w)):
					u.options[prevFlag] = true
					prevFlag = ""
				case w == "PLACEHOLDER":
					u.positionals++
				default:
					prevFlag = ""
				}
			}
			continue
		}
		if m := optionLine.FindStringSubmatch(line); m != nil {
			u.options[strings.TrimLeft(m[1], "-")] = m[2] != ""
		}
	}
	return u
}

// TestConfigs_CommandLinesInCommentsParse checks every capyctl command line
// written in a file under configs/ against the CLI: the command exists, each
// option is one the command's help lists, and an example line passes no
// more arguments than its usage takes.
func TestConfigs_CommandLinesInCommentsParse(t *testing.T) {
	table := Commands(newMeta())
	examples := configExamples(t)
	if len(examples) < 10 {
		t.Fatalf("found %d capyctl command lines under configs/, expected many more: is the extraction broken?", len(examples))
	}
	for _, ex := range examples {
		t.Run(ex.where, func(t *testing.T) {
			if len(ex.words) == 0 || strings.HasPrefix(ex.words[0], "-") {
				return // "capyctl --version", or the user name in a useradd line
			}
			// The longest run of words that names a command.
			name, n := "", 0
			for i := 1; i <= len(ex.words); i++ {
				if _, ok := table[strings.Join(ex.words[:i], " ")]; ok {
					name, n = strings.Join(ex.words[:i], " "), i
				}
			}
			if name == "" {
				t.Fatalf("capyctl %s: no such command", strings.Join(ex.words, " "))
			}
			cmd, err := table[name]()
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := cmd.(*ParentCommand); ok {
				t.Fatalf("capyctl %s: %q only groups subcommands", strings.Join(ex.words, " "), name)
			}
			u := parseUsage(placeholder.ReplaceAllString(cmd.Help(), "PLACEHOLDER"))
			positionals := 0
			args := ex.words[n:]
			for i := 0; i < len(args); i++ {
				w := args[i]
				if !strings.HasPrefix(w, "-") {
					positionals++
					continue
				}
				opt, _, inline := strings.Cut(strings.TrimLeft(w, "-"), "=")
				takes, ok := u.options[opt]
				if !ok {
					t.Fatalf("capyctl %s: %s has no option %s (capyctl %s --help)", strings.Join(ex.words, " "), name, w, name)
				}
				if takes && !inline {
					i++
				}
			}
			if ex.whole && positionals > u.positionals {
				t.Fatalf("capyctl %s: %s takes %d argument(s), the line passes %d", strings.Join(ex.words, " "), name, u.positionals, positionals)
			}
		})
	}
}

// TestCommands_HelpNamesNoOtherBuild: there is one build of capyctl; a help
// text that tells what "a build without" some feature does describes a
// program nobody can run.
func TestCommands_HelpNamesNoOtherBuild(t *testing.T) {
	for name, factory := range Commands(newMeta()) {
		cmd, err := factory()
		if err != nil {
			t.Fatal(err)
		}
		text := strings.ToLower(cmd.Synopsis() + "\n" + cmd.Help())
		for _, s := range []string{"a build without", "this build", "builds without", "build with"} {
			if strings.Contains(text, s) {
				t.Errorf("capyctl %s --help says %q: name no build that does not exist", name, s)
			}
		}
	}
}
