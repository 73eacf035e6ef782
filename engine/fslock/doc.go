// Package fslock takes exclusive advisory locks on open files, without
// waiting: flock(2) LOCK_EX|LOCK_NB on Unix, LockFileEx on the first byte
// on Windows, nothing elsewhere (js, wasip1, plan9: TryLock always
// succeeds). A lock belongs to the open file: closing the file, or the
// process ending, releases it. The contributor app's one-instance lock
// (app/instance) and a worker's slice folder (engine/slice.OpenStore) use
// it.
package fslock
