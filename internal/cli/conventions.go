package cli

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/service"
)

// rejectUnknownSubcommands makes every command group (smx, smx agent, ...)
// fail on a subcommand it does not have, naming the closest one, instead of
// printing its help and exiting 0. Without arguments a group still prints
// its help.
func rejectUnknownSubcommands(c *cobra.Command) {
	for _, sub := range c.Commands() {
		rejectUnknownSubcommands(sub)
	}
	if !c.HasSubCommands() || c.Runnable() {
		return
	}
	c.Args = cobra.ArbitraryArgs
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		hint := fmt.Sprintf("see `%s --help`", cmd.CommandPath())
		if cmd.SuggestionsMinimumDistance <= 0 {
			cmd.SuggestionsMinimumDistance = 2
		}
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			hint = fmt.Sprintf("did you mean `%s %s`?", cmd.CommandPath(), s[0])
		}
		return fmt.Errorf("unknown command %q for %q: %s: %w", args[0], cmd.CommandPath(), hint, errdefs.ErrInvalid)
	}
}

// flagError keeps a bad flag value's error to one line that names the
// command's help, and makes it smx's own failure (exit 125).
func flagError(cmd *cobra.Command, err error) error {
	msg := err.Error()
	// pflag's parse errors end with strconv's wording; the flag and the
	// value are what a user needs.
	if i := strings.Index(msg, ": strconv."); i >= 0 {
		msg = msg[:i]
	}
	return fmt.Errorf("%s: see `%s --help`: %w", msg, cmd.CommandPath(), errdefs.ErrInvalid)
}

// execExitError turns an exec whose command could not start into the exit
// status docker gives it (127 not found, 126 not executable), with the
// guest's reason on stderr; other errors pass through.
func execExitError(err error) error {
	if code, reason, ok := service.CommandStartError(err); ok {
		return &ExitError{Code: code, Err: errors.New(userMessage(reason))}
	}
	return err
}

// classSuffixes are the errdefs class names, which end wrapped messages
// (": failed precondition") and say nothing a user acts on.
var classSuffixes = func() []string {
	var out []string
	for _, c := range []error{errdefs.ErrNotFound, errdefs.ErrExists, errdefs.ErrInvalid, errdefs.ErrInUse,
		errdefs.ErrUnavailable, errdefs.ErrDenied, errdefs.ErrFailed} {
		out = append(out, ": "+c.Error())
	}
	return out
}()

// internalPrefixes are the package and step names that start smx's wrapped
// errors ("supervisor: ", "guest: exec: start X: "): the chain is for
// --debug; the user gets the sentence at the end.
var internalPrefixes = []string{"agentproto", "audit", "guest", "image", "initramfs", "kernel", "netstack",
	"policy", "sandbox", "snapshot", "statedir", "supervisor", "tarfs", "tlsgw", "vm", "qmp", "creds", "exec", "copy-in", "copy-out"}

// userMessage is the line a user sees for err's message: the errdefs class
// and leading "pkg: op:" steps dropped, and for a chain of path steps
// ("tarfs: a/b: mkdirat a: statat a: path escapes from parent") the last
// cause with the first path it concerned. Under --debug the whole chain is
// printed instead.
func userMessage(msg string) string {
	first, rest, multi := strings.Cut(msg, "\n")
	for _, suf := range classSuffixes {
		first = strings.TrimSuffix(first, suf)
	}
	for {
		trimmed := false
		for _, p := range internalPrefixes {
			if s, ok := strings.CutPrefix(first, p+": "); ok && s != "" {
				first, trimmed = s, true
			}
		}
		if !trimmed {
			break
		}
	}
	first = dropSyscallSteps(first)
	if multi {
		return first + "\n" + rest
	}
	return first
}

// syscallStep is one step of a file operation chain ("mkdirat esc/sub").
var syscallStep = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^(open|openat|stat|statat|lstat|fstatat|mkdir|mkdirat|chmod|fchmodat|chown|lchown|fchownat|link|linkat|symlink|symlinkat|readlink|readlinkat|unlink|unlinkat|rename|renameat|remove|read|write|chtimes|utimensat) \S+$`)
})

// dropSyscallSteps turns "a/f: mkdirat a: statat a: path escapes from
// parent" into "a/f: path escapes from parent": the entry the user named
// and the reason, without the system calls in between.
func dropSyscallSteps(msg string) string {
	parts := strings.Split(msg, ": ")
	if len(parts) < 3 {
		return msg
	}
	out := parts[:1:1]
	for _, p := range parts[1 : len(parts)-1] {
		if !syscallStep().MatchString(p) {
			out = append(out, p)
		}
	}
	return strings.Join(append(out, parts[len(parts)-1]), ": ")
}

// placeholderWords name what a flag takes in --help ("--image NAME", not
// "--image string" or a word pflag lifted from `backquotes` in the usage).
var placeholderWords = map[string]string{
	"image": "NAME", "name": "NAME", "profile": "PROFILE", "memory": "SIZE", "disk": "SIZE",
	"accel": "kvm|tcg", "env": "KEY=VALUE", "workdir": "DIR", "user": "USER", "cpus": "N",
	"since": "TIME", "key-file": "FILE", "timeout": "DURATION", "from": "SOURCE", "output": "FILE",
	"volume": "HOST:GUEST[:OPTIONS]", "volume-cache": "NAME[:GUESTPATH][:ro|shared]", "mount": "HOST:GUEST[:OPTIONS]",
	"listen": "unix:PATH|tcp:ADDR", "token-file": "FILE", "sandbox": "NAME",
	"idle-stop": "DURATION", "worktree": "NAME", "worktree-dir": "DIR", "publish": "[HOSTIP:]HOSTPORT:GUESTPORT", "max-size": "SIZE", "detach-keys": "KEYS",
	// "COMMAND FLAG" when one command's flag takes something else.
	"ui listen": "HOST:PORT",
}

// wordValue is a flag value whose --help placeholder is a word.
type wordValue struct {
	pflag.Value
	word string
}

func (w wordValue) Type() string { return w.word }

// setPlaceholders gives every command's flags word placeholders and keeps
// backquotes in usage text from being taken for one.
func setPlaceholders(c *cobra.Command) {
	for _, sub := range c.Commands() {
		setPlaceholders(sub)
	}
	c.LocalFlags().VisitAll(func(f *pflag.Flag) {
		f.Usage = strings.ReplaceAll(f.Usage, "`", "'")
		w, ok := placeholderWords[c.Name()+" "+f.Name]
		if !ok {
			w, ok = placeholderWords[f.Name]
		}
		if ok && f.Value.Type() != "bool" {
			f.Value = wordValue{f.Value, w}
			if f.DefValue == "[]" {
				f.DefValue = "" // pflag no longer knows the list's empty value
			}
		}
	})
}
