package main

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// parentPIDEnv names the variable harness/processes.py sets to its own PID.
const parentPIDEnv = "GPUSHARE_HARNESS_PARENT_PID"

// exitWithParent makes the kernel send SIGKILL to this process when the process that
// started it dies, so a test run killed with SIGKILL leaves no etcd or apiserver behind.
// SIGKILL, not SIGTERM: every component gets the signal at once, and an apiserver whose
// etcd is already gone hangs in graceful shutdown (RemoveEndpoints retries against etcd).
// It only acts when the starter asked for it through GPUSHARE_HARNESS_PARENT_PID, and
// must run on the main thread (see init in main.go).
func exitWithParent() {
	want, err := strconv.Atoi(os.Getenv(parentPIDEnv))
	if err != nil || want <= 0 {
		return
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0); errno != 0 {
		fmt.Fprintf(os.Stderr, "harness: prctl(PR_SET_PDEATHSIG): %v\n", errno)
		return
	}
	// The parent may have died before prctl took effect; then we were re-parented.
	if os.Getppid() != want {
		fmt.Fprintf(os.Stderr, "harness: parent %d is gone, exiting\n", want)
		os.Exit(1)
	}
}
