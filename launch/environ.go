package launch

import (
	"strconv"
	"strings"
)

// Environ returns the variables a launcher sets for the worker j describes,
// as NAME=VALUE: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
// GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (the names torchrun uses) and
// TANDEM_TOKEN, TANDEM_RESTART_COUNT, TANDEM_MAX_RESTARTS, TANDEM_RUN_ID,
// TANDEM_STORE_PREFIX.
// Every one of them is present, empty when j does not know it (an empty
// variable reads as unset), so that Overlay replaces whatever the launcher
// itself inherited. Read of the result gives back j's fields with Launcher
// TandemRun: TANDEM_RESTART_COUNT marks a worker of `tandem run`.
func (j Job) Environ() []string {
	num := func(v int) string {
		if v < 0 {
			return ""
		}
		return strconv.Itoa(v)
	}
	port := ""
	if j.MasterPort > 0 {
		port = strconv.Itoa(j.MasterPort)
	}
	return []string{
		"RANK=" + num(j.Rank),
		"WORLD_SIZE=" + num(j.WorldSize),
		"LOCAL_RANK=" + num(j.LocalRank),
		"LOCAL_WORLD_SIZE=" + num(j.LocalWorldSize),
		"GROUP_RANK=" + num(j.NodeRank),
		"GROUP_WORLD_SIZE=" + num(j.NumNodes),
		"MASTER_ADDR=" + j.MasterAddr,
		"MASTER_PORT=" + port,
		TokenEnv + "=" + j.Token,
		RestartCountEnv + "=" + strconv.Itoa(max(j.RestartCount, 0)),
		MaxRestartsEnv + "=" + num(j.MaxRestarts),
		RunIDEnv + "=" + j.RunID,
		StorePrefixEnv + "=" + j.StorePrefix,
	}
}

// Overlay returns base (an environment such as os.Environ()) with every
// variable of over set: entries of base with a name that over sets are
// dropped, and over's entries follow the rest in their order. Neither
// argument is modified.
func Overlay(base, over []string) []string {
	set := make(map[string]bool, len(over))
	for _, kv := range over {
		name, _, _ := strings.Cut(kv, "=")
		set[name] = true
	}
	env := make([]string, 0, len(base)+len(over))
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if !set[name] {
			env = append(env, kv)
		}
	}
	return append(env, over...)
}

// Lookup returns a lookup function over env, a list of NAME=VALUE entries
// such as Environ's or os.Environ()'s; a later entry wins over an earlier
// one with the same name, as in exec.Cmd's Env. Read(Lookup(env)) reads the
// job a process started with env would see.
func Lookup(env []string) func(string) (string, bool) {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		if name, value, ok := strings.Cut(kv, "="); ok {
			m[name] = value
		}
	}
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}
