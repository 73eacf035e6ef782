//go:build linux

package demo

import "syscall"

// sysProcAttr makes the kernel send the child SIGTERM when its parent dies
// (prctl PR_SET_PDEATHSIG), so a killed demo leaves no orphans.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
