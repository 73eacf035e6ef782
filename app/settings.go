package app

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"fyne.io/fyne/v2"
	"fyne.io/fyne/v2/container"
	"fyne.io/fyne/v2/theme"
	"fyne.io/fyne/v2/widget"

	"github.com/kvasir-ai/kvasir/app/limits"
	"github.com/kvasir-ai/kvasir/app/node"
	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/engine/vulkan"
)

// ErrSettings wraps every settings validation error.
var ErrSettings = errors.New("settings")

// Settings are the owner's choices, persisted in fyne Preferences under
// the Pref* keys.
type Settings struct {
	GatewayURL string  // wss://host[:port]; "" = node.DefaultGateway (the public gateway)
	CAFile     string  // PEM file of extra root CAs for the gateway; "" = system roots
	SliceDir   string  // folder of the expert slice; "" = node.DefaultSliceDir (DATA/slice)
	QuotaGB    float64 // disk quota for experts the backbone assigns, GB (10^9 bytes); 0 = serve the slice folder as it is (node.Config.QuotaBytes)
	Threads    int     // compute threads; 0 = all CPUs
	CPULimit   int     // percent of this computer's CPU time the app may use, 1-100 (100 = no limit); applied live
	// Backend is where the experts are computed ("Compute on"): "auto" (a
	// GPU through Vulkan if there is one, else the CPU; never a software
	// renderer such as lavapipe), "cpu" or "vulkan:N" (device N of
	// engine/vulkan.Devices). node.Config.Backend.
	Backend        string
	PauseOnBattery bool
	OnlyWhenIdle   bool
	MaxTempC       float64 // 0 = no temperature limit
	ResumeTempC    float64 // 0 = MaxTempC - limits.DefaultHysteresisC
	WorkHours      string  // "HH:MM-HH:MM" local time the worker may work (limits.ParseHours); "" = any time
	StartAtLogin   bool    // start the app when the owner logs in (package autostart)
	NotifyCredits  bool    // a desktop notification for each new credit statement
}

// Preference keys.
const (
	PrefGateway  = "gateway_url"
	PrefCAFile   = "ca_file"
	PrefSliceDir = "slice_dir"
	PrefQuotaGB  = "quota_gb"
	// PrefQuotaGiB is the quota in GiB as versions before the decimal
	// units saved it; read when PrefQuotaGB is missing.
	PrefQuotaGiB       = "quota_gib"
	PrefThreads        = "threads"
	PrefCPULimit       = "cpu_limit"
	PrefBackend        = "backend"
	PrefPauseOnBattery = "pause_on_battery"
	PrefOnlyWhenIdle   = "only_when_idle"
	PrefMaxTempC       = "max_temp_c"
	PrefResumeTempC    = "resume_temp_c"
	PrefWorkHours      = "work_hours"
	PrefStartAtLogin   = "start_at_login"
	PrefNotifyCredits  = "notify_credits"
)

// DefaultSettings are used for keys never saved: the public gateway and
// the slice folder in the data folder (both left empty here: NodeConfig
// fills them in), 4 GB of disk for the experts the backbone assigns,
// no CPU limit (100 %), pause on battery on, a temperature limit of 90 °C
// resuming at 80 °C, computing on a GPU when there is one (Backend
// "auto"). A first run needs no setting.
var DefaultSettings = Settings{QuotaGB: node.DefaultQuotaBytes / 1e9, CPULimit: 100, Backend: "auto", PauseOnBattery: true, MaxTempC: 90, ResumeTempC: 80}

// LoadSettings reads settings from p, with DefaultSettings for missing keys.
func LoadSettings(p fyne.Preferences) Settings {
	d := DefaultSettings
	return Settings{
		GatewayURL:     p.StringWithFallback(PrefGateway, d.GatewayURL),
		CAFile:         p.StringWithFallback(PrefCAFile, d.CAFile),
		SliceDir:       p.StringWithFallback(PrefSliceDir, d.SliceDir),
		QuotaGB:        loadQuotaGB(p, d.QuotaGB),
		Threads:        p.IntWithFallback(PrefThreads, d.Threads),
		CPULimit:       p.IntWithFallback(PrefCPULimit, d.CPULimit),
		Backend:        p.StringWithFallback(PrefBackend, d.Backend),
		PauseOnBattery: p.BoolWithFallback(PrefPauseOnBattery, d.PauseOnBattery),
		OnlyWhenIdle:   p.BoolWithFallback(PrefOnlyWhenIdle, d.OnlyWhenIdle),
		MaxTempC:       p.FloatWithFallback(PrefMaxTempC, d.MaxTempC),
		ResumeTempC:    p.FloatWithFallback(PrefResumeTempC, d.ResumeTempC),
		WorkHours:      p.StringWithFallback(PrefWorkHours, d.WorkHours),
		StartAtLogin:   p.BoolWithFallback(PrefStartAtLogin, d.StartAtLogin),
		NotifyCredits:  p.BoolWithFallback(PrefNotifyCredits, d.NotifyCredits),
	}
}

// loadQuotaGB reads PrefQuotaGB, else an older PrefQuotaGiB converted to
// GB (to the MB), else def.
func loadQuotaGB(p fyne.Preferences, def float64) float64 {
	if v := p.FloatWithFallback(PrefQuotaGB, -1); v >= 0 {
		return v
	}
	if v := p.FloatWithFallback(PrefQuotaGiB, -1); v >= 0 {
		return math.Round(v*(1<<30)/1e6) / 1e3
	}
	return def
}

// Save writes s to p.
func (s Settings) Save(p fyne.Preferences) {
	p.SetString(PrefGateway, s.GatewayURL)
	p.SetString(PrefCAFile, s.CAFile)
	p.SetString(PrefSliceDir, s.SliceDir)
	p.SetFloat(PrefQuotaGB, s.QuotaGB)
	p.SetInt(PrefThreads, s.Threads)
	p.SetInt(PrefCPULimit, s.CPULimit)
	p.SetString(PrefBackend, s.Backend)
	p.SetBool(PrefPauseOnBattery, s.PauseOnBattery)
	p.SetBool(PrefOnlyWhenIdle, s.OnlyWhenIdle)
	p.SetFloat(PrefMaxTempC, s.MaxTempC)
	p.SetFloat(PrefResumeTempC, s.ResumeTempC)
	p.SetString(PrefWorkHours, s.WorkHours)
	p.SetBool(PrefStartAtLogin, s.StartAtLogin)
	p.SetBool(PrefNotifyCredits, s.NotifyCredits)
}

// NeedsRestart reports whether going from old to s needs a new worker:
// the gateway, its CA, the slice folder, the quota, the thread count and
// the compute device are fixed for a worker's life (a device holds the
// experts' weights in its memory: switching means uploading them again,
// which a restart of a few seconds does). Limits (the CPU limit too),
// start at login and notifications apply to the running worker.
func NeedsRestart(old, s Settings) bool {
	return old.GatewayURL != s.GatewayURL || old.CAFile != s.CAFile || old.SliceDir != s.SliceDir ||
		old.QuotaGB != s.QuotaGB || old.Threads != s.Threads || old.Backend != s.Backend
}

// Validate checks s: a wss:// (or ws:// for loopback tests) gateway URL
// with a host, quota >= 0, threads in [0, 4096], a CPU limit in
// [1, 100] %, a backend vulkan.ParseBackend reads, temperatures in
// [0, 120] °C with ResumeTempC < MaxTempC when both are set. Errors wrap
// ErrSettings.
func (s Settings) Validate() error {
	if s.GatewayURL != "" {
		if err := node.CheckGatewayURL(s.GatewayURL); err != nil {
			return fmt.Errorf("%w: %v", ErrSettings, err)
		}
	}
	if s.QuotaGB < 0 || s.QuotaGB > 1e6 {
		return fmt.Errorf("%w: disk quota %g GB out of range", ErrSettings, s.QuotaGB)
	}
	if s.Threads < 0 || s.Threads > 4096 {
		return fmt.Errorf("%w: %d CPU threads out of range", ErrSettings, s.Threads)
	}
	if s.CPULimit < 1 || s.CPULimit > 100 {
		return fmt.Errorf("%w: CPU limit %d%%: want 1-100 (100 = no limit)", ErrSettings, s.CPULimit)
	}
	if _, err := vulkan.ParseBackend(s.Backend); err != nil {
		return fmt.Errorf("%w: compute device: %v", ErrSettings, err)
	}
	if s.MaxTempC < 0 || s.MaxTempC > 120 || s.ResumeTempC < 0 || s.ResumeTempC > 120 {
		return fmt.Errorf("%w: temperatures must be between 0 and 120 °C", ErrSettings)
	}
	if _, err := limits.ParseHours(s.WorkHours); err != nil {
		return fmt.Errorf("%w: working hours %q: want HH:MM-HH:MM, e.g. 22:00-07:00", ErrSettings, s.WorkHours)
	}
	if s.MaxTempC > 0 && s.ResumeTempC > 0 && s.ResumeTempC >= s.MaxTempC {
		return fmt.Errorf("%w: resume temperature %g °C must be below the limit %g °C", ErrSettings, s.ResumeTempC, s.MaxTempC)
	}
	return nil
}

// Limits returns the limits part of s.
func (s Settings) Limits() limits.Limits {
	h, _ := limits.ParseHours(s.WorkHours) // Validate refuses a bad one
	return limits.Limits{PauseOnBattery: s.PauseOnBattery, OnlyWhenIdle: s.OnlyWhenIdle, MaxTempC: s.MaxTempC, ResumeTempC: s.ResumeTempC,
		Hours: h}
}

// QuotaBytes is the disk quota in bytes (0 = none).
func (s Settings) QuotaBytes() uint64 { return uint64(math.Round(s.QuotaGB * 1e9)) }

// SettingsForm is the settings tab: one field per Settings field and a
// Save button that validates, persists to Preferences and calls OnSave.
type SettingsForm struct {
	Content fyne.CanvasObject

	prefs  fyne.Preferences
	OnSave func(Settings) // called after a valid save; may be nil
	// OnSaveLocal is called after a valid save, before OnSave: the
	// window's own use of the settings (notifications); may be nil.
	OnSaveLocal                                    func(Settings)
	gateway, ca, slice, quota, threads, maxT, resT *widget.Entry
	cpu                                            *widget.Entry
	compute                                        *widget.Select // "Compute on"
	computeNow, computeHint                        *widget.Label
	computeVals                                    []string // the backend of each compute option
	backend                                        string   // the backend shown (Show), kept if no option matches
	hours                                          *widget.Entry
	battery, idle, login, notify                   *widget.Check
	message                                        *widget.Label
	save                                           *widget.Button
}

// NewSettingsForm builds the form with the settings stored in p.
func NewSettingsForm(p fyne.Preferences, onSave func(Settings)) *SettingsForm {
	f := &SettingsForm{prefs: p, OnSave: onSave}
	entry := func(ph string) *widget.Entry { e := widget.NewEntry(); e.SetPlaceHolder(ph); return e }
	f.gateway = entry(node.DefaultGateway() + " (default)")
	f.ca = entry("PEM file (optional; the system's CAs by default)")
	f.slice = entry("the app's data folder/slice (default)")
	f.quota = entry("GB; 0 = serve the folder as it is")
	f.threads = entry(fmt.Sprintf("0 = all %d cores", runtime.NumCPU()))
	f.cpu = entry("100 = no limit")
	f.compute = widget.NewSelect(nil, nil)
	f.computeNow = widget.NewLabel("Now computing on: —")
	f.computeNow.Truncation = fyne.TextTruncateEllipsis
	f.computeHint = widget.NewLabel("")
	f.computeHint.Wrapping = fyne.TextWrapWord
	f.computeHint.Importance = widget.WarningImportance
	f.computeHint.Hide()
	f.maxT = entry("°C, 0 = no limit")
	f.resT = entry("°C, default limit − 10")
	f.hours = entry("any time; e.g. 22:00-07:00")
	f.battery = widget.NewCheck("Pause on battery", nil)
	f.idle = widget.NewCheck("Only when the computer is idle", nil)
	f.login = widget.NewCheck("Start kvasir when I log in", nil)
	f.notify = widget.NewCheck("Notify me of each new credit", nil)
	f.message = widget.NewLabel("")
	f.message.Wrapping = fyne.TextWrapWord
	f.save = widget.NewButtonWithIcon("Save", theme.DocumentSaveIcon(), func() { f.Submit() })
	form := widget.NewForm(
		widget.NewFormItem("Gateway URL", f.gateway),
		widget.NewFormItem("Gateway CA", f.ca),
		widget.NewFormItem("Slice folder", f.slice),
		widget.NewFormItem("Disk quota (GB)", f.quota),
		threadsItem(f.threads),
		widget.NewFormItem("Compute on", container.NewVBox(f.compute, f.computeNow, f.computeHint, computeAbout())),
		widget.NewFormItem("Limits", container.NewVBox(f.battery, f.idle)),
		cpuLimitItem(f.cpu),
		widget.NewFormItem("Stop above (°C)", f.maxT),
		widget.NewFormItem("Resume below (°C)", f.resT),
		widget.NewFormItem("Work only between", f.hours),
		widget.NewFormItem("Desktop", container.NewVBox(f.login, f.notify)),
	)
	f.Content = container.NewVScroll(container.NewVBox(form, container.NewHBox(f.save), f.message))
	f.backend = LoadSettings(p).Backend
	f.SetDevices(vulkan.Devices())
	f.Show(LoadSettings(p))
	return f
}

// computeHintText is said under the "Compute on" picker.
const computeHintText = "Automatic takes a GPU when there is one, else the CPU (a software renderer such as lavapipe only when chosen). A change restarts the worker (a few seconds)."

// computeAbout says what the "Compute on" choices mean, in a form hint's
// small text, wrapped (a FormItem's HintText does not wrap and would
// widen the form beyond a 640-pixel window).
func computeAbout() *widget.RichText {
	t := widget.NewRichText(&widget.TextSegment{Text: computeHintText,
		Style: widget.RichTextStyle{SizeName: theme.SizeNameCaptionText, ColorName: theme.ColorNamePlaceHolder}})
	t.Wrapping = fyne.TextWrapWord
	return t
}

// deviceKind names a device type for people.
func deviceKind(t vulkan.DeviceType) string {
	switch t {
	case vulkan.TypeDiscrete:
		return "discrete GPU"
	case vulkan.TypeIntegrated:
		return "integrated GPU"
	case vulkan.TypeVirtual:
		return "virtual GPU"
	case vulkan.TypeCPU:
		return "software renderer on the CPU"
	}
	return "other device"
}

// computeOptions returns the "Compute on" choices for the devices found
// and the backend each stands for: automatic, the CPU, then each device
// with its kind and memory, e.g. "NVIDIA GeForce RTX 4090 (discrete GPU,
// 25.8 GB)" for "vulkan:0". A saved "vulkan:N" whose device is not
// listed keeps an option of its own ("device N (not found now)").
func computeOptions(devs []vulkan.Device, saved string) (labels, vals []string) {
	labels = []string{"Automatic (a GPU if there is one, else the CPU)", "CPU only"}
	vals = []string{"auto", "cpu"}
	for _, d := range devs {
		labels = append(labels, fmt.Sprintf("%s (%s, %s)", d.Name, deviceKind(d.Type), status.FormatBytes(d.MemoryBytes)))
		vals = append(vals, vulkan.Backend{Kind: "vulkan", Index: d.Index}.String())
	}
	if b, err := vulkan.ParseBackend(saved); err == nil && b.Kind == "vulkan" && !slices.Contains(vals, b.String()) {
		labels = append(labels, fmt.Sprintf("device %d (not found now)", b.Index))
		vals = append(vals, b.String())
	}
	return labels, vals
}

// SetDevices fills the "Compute on" picker with the Vulkan devices found
// (engine/vulkan.Devices; err, when listing failed, is said under it),
// keeping the choice shown. NewSettingsForm calls it with the devices of
// this machine.
func (f *SettingsForm) SetDevices(devs []vulkan.Device, err error) {
	labels, vals := computeOptions(devs, f.backend)
	f.computeVals = vals
	f.compute.SetOptions(labels)
	switch {
	case err != nil:
		f.computeHint.SetText("No GPU can be used: " + err.Error() + ".")
		f.computeHint.Show()
	case len(devs) == 0:
		f.computeHint.SetText("No Vulkan device found: the CPU computes.")
		f.computeHint.Show()
	default:
		f.computeHint.Hide()
	}
	f.showBackend(f.backend)
}

// showBackend selects the option of backend b (a bad or unknown value:
// automatic).
func (f *SettingsForm) showBackend(b string) {
	f.backend = b
	want := "auto"
	if pb, err := vulkan.ParseBackend(b); err == nil {
		want = pb.String()
	}
	if i := slices.Index(f.computeVals, want); i >= 0 {
		f.compute.SetSelectedIndex(i)
	}
}

// ShowComputing shows where the running worker computes now (a
// status.Snapshot's Device, e.g. "NVIDIA GeForce RTX 4090 (Vulkan)"; ""
// when unknown) under the picker.
func (f *SettingsForm) ShowComputing(device string) {
	if device == "" {
		device = "—"
	}
	if t := "Now computing on: " + device; f.computeNow.Text != t {
		f.computeNow.SetText(t)
	}
}

// threadsItem is the CPU threads field with what 0 means said under it.
func threadsItem(e *widget.Entry) *widget.FormItem {
	it := widget.NewFormItem("CPU threads", e)
	it.HintText = "0 = use all of this computer's cores; fewer leave room for other programs"
	return it
}

// cpuLimitItem is the CPU limit field with what it does said under it.
func cpuLimitItem(e *widget.Entry) *widget.FormItem {
	it := widget.NewFormItem("CPU limit (%)", e)
	it.HintText = "share of this computer's CPU time kvasir may use; it works, then rests; 100 = no limit"
	return it
}

func fmtFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// Show fills the fields with s.
func (f *SettingsForm) Show(s Settings) {
	f.gateway.SetText(s.GatewayURL)
	f.ca.SetText(s.CAFile)
	f.slice.SetText(s.SliceDir)
	f.quota.SetText(fmtFloat(s.QuotaGB))
	f.threads.SetText(strconv.Itoa(s.Threads))
	f.cpu.SetText(strconv.Itoa(s.CPULimit))
	f.showBackend(s.Backend)
	f.maxT.SetText(fmtFloat(s.MaxTempC))
	f.resT.SetText(fmtFloat(s.ResumeTempC))
	f.battery.SetChecked(s.PauseOnBattery)
	f.idle.SetChecked(s.OnlyWhenIdle)
	f.hours.SetText(s.WorkHours)
	f.login.SetChecked(s.StartAtLogin)
	f.notify.SetChecked(s.NotifyCredits)
}

// Read parses the fields. Errors wrap ErrSettings.
func (f *SettingsForm) Read() (Settings, error) {
	num := func(name, v string) (float64, error) {
		v = strings.TrimSpace(v)
		if v == "" {
			return 0, nil
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: %s %q is not a number", ErrSettings, name, v)
		}
		return x, nil
	}
	s := Settings{GatewayURL: strings.TrimSpace(f.gateway.Text), CAFile: strings.TrimSpace(f.ca.Text),
		SliceDir: strings.TrimSpace(f.slice.Text), PauseOnBattery: f.battery.Checked, OnlyWhenIdle: f.idle.Checked,
		WorkHours: strings.TrimSpace(f.hours.Text), StartAtLogin: f.login.Checked, NotifyCredits: f.notify.Checked,
		Backend: f.backend}
	if i := f.compute.SelectedIndex(); i >= 0 && i < len(f.computeVals) {
		s.Backend = f.computeVals[i]
	}
	var err error
	if s.QuotaGB, err = num("disk quota", f.quota.Text); err != nil {
		return s, err
	}
	th, err := num("CPU threads", f.threads.Text)
	if err != nil {
		return s, err
	}
	if th != float64(int(th)) {
		return s, fmt.Errorf("%w: CPU threads must be a whole number", ErrSettings)
	}
	s.Threads = int(th)
	cpu, err := num("CPU limit", f.cpu.Text)
	if err != nil {
		return s, err
	}
	if strings.TrimSpace(f.cpu.Text) == "" {
		cpu = 100 // empty: no limit
	}
	if cpu != float64(int(cpu)) {
		return s, fmt.Errorf("%w: CPU limit must be a whole percent, 1-100", ErrSettings)
	}
	s.CPULimit = int(cpu)
	if s.MaxTempC, err = num("temperature limit", f.maxT.Text); err != nil {
		return s, err
	}
	if s.ResumeTempC, err = num("resume temperature", f.resT.Text); err != nil {
		return s, err
	}
	return s, s.Validate()
}

// Submit validates and saves the fields; the message line says what
// happened and whether the worker restarts to apply it (NeedsRestart). It
// returns the validation error, if any.
func (f *SettingsForm) Submit() error {
	s, err := f.Read()
	if err != nil {
		f.message.SetText("Not saved: " + err.Error())
		return err
	}
	old := LoadSettings(f.prefs)
	s.Save(f.prefs)
	switch {
	case old == s:
		f.message.SetText("Saved (nothing changed).")
	case NeedsRestart(old, s):
		f.message.SetText("Saved. The worker restarts to apply the new gateway, slice, quota, threads or compute device.")
	default:
		f.message.SetText("Saved and applied; the worker keeps running.")
	}
	if f.OnSaveLocal != nil {
		f.OnSaveLocal(s)
	}
	if f.OnSave != nil {
		f.OnSave(s)
	}
	return nil
}
