//go:build linux

package demo

import "syscall"

// sysProcAttr makes the kernel send the child SIGTERM when its parent dies
// (prctl PR_SET_PDEATHSIG), so a killed demo leaves no orphans, and puts
// the child in its own process group: a Ctrl-C in the terminal (or a
// signal to the parent's group) reaches only the parent, which stops its
// roles in order (backbone up: gateway, hub, then serve, whose streams end
// with an error event and [DONE]) instead of every role receiving it at
// once, and serve taking the parent's SIGTERM as a second signal.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
}
