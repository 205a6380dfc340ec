package redfish_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/virtmetal/virtmetal/machine/memory"
	"github.com/virtmetal/virtmetal/redfish"
)

// importTime is how long the fixture's machines take to import an image
// after slowMedia.
const importTime = 10 * time.Second

// slowMedia gives the fixture machines whose inserted images import for
// importTime, as KubeVirt's do, so that inserts answer with a Task. It runs
// before the fixture's first request.
func slowMedia(f *fixture) {
	f.backend.Backend = memory.New(memory.Options{Machines: 2, Now: f.clock.Now, MediaImportTime: importTime})
}

const (
	taskMonitor1 = "/redfish/v1/TaskService/TaskMonitors/1"
	task1        = "/redfish/v1/TaskService/Tasks/1"
)

// TestInsertMediaTask follows one insert through its Task: 202 with the
// monitor's Location, progress with the clock, a retry that finds the
// same task, another image refused, and the monitor's final 204.
func TestInsertMediaTask(t *testing.T) {
	f := newFixture(t, nil)
	slowMedia(f)
	insert := asAdmin("POST", sysInsert0, `{"Image":"`+image+`","TransferProtocolType":"HTTP"}`)
	steps := []struct {
		name       string
		advance    time.Duration
		req        request
		wantStatus int
		// what the answer's body, a Task, says; "" where it is not one
		wantState   string
		wantPercent float64
		wantMessage string // the MessageId of the Task's one message
	}{
		{name: "insert accepted", req: insert, wantStatus: 202, wantState: "Running", wantMessage: "TaskEvent.1.0.TaskStarted"},
		{name: "monitor while running", advance: 4500 * time.Millisecond, req: asAdmin("GET", taskMonitor1, ""), wantStatus: 202, wantState: "Running", wantPercent: 45, wantMessage: "TaskEvent.1.0.TaskStarted"},
		{name: "retry finds the same task", req: insert, wantStatus: 202, wantState: "Running", wantPercent: 45, wantMessage: "TaskEvent.1.0.TaskStarted"},
		{name: "another image is refused", req: asAdmin("POST", sysInsert0, `{"Image":"http://images.example/other.iso"}`), wantStatus: 409},
		{name: "task while running", req: asAdmin("GET", task1, ""), wantStatus: 200, wantState: "Running", wantPercent: 45, wantMessage: "TaskEvent.1.0.TaskStarted"},
		{name: "monitor when done", advance: 6 * time.Second, req: asAdmin("GET", taskMonitor1, ""), wantStatus: 204},
		{name: "task when done", req: asAdmin("GET", task1, ""), wantStatus: 200, wantState: "Completed", wantPercent: 100, wantMessage: "TaskEvent.1.0.TaskCompletedOK"},
		{name: "the ready image again", req: insert, wantStatus: 204},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			f.clock.Advance(s.advance)
			res := f.do(s.req)
			if res.status != s.wantStatus {
				t.Fatalf("%s %s: %d, want %d: %s", s.req.method, s.req.path, res.status, s.wantStatus, res.raw)
			}
			if s.wantStatus == http.StatusAccepted {
				if loc := res.header.Get("Location"); loc != taskMonitor1 {
					t.Errorf("Location %q, want %s", loc, taskMonitor1)
				}
			}
			if s.wantState == "" {
				return
			}
			got := []any{res.json["@odata.id"], res.json["TaskState"], res.json["PercentComplete"], res.json["TaskMonitor"], messageIDsOf(res.json["Messages"])}
			want := []any{task1, s.wantState, s.wantPercent, taskMonitor1, s.wantMessage}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("task %v, want %v", got, want)
			}
		})
	}
	if members := lookup(f.do(asAdmin("GET", "/redfish/v1/TaskService/Tasks", "")).json, "Members"); fmt.Sprint(members) != fmt.Sprint([]any{map[string]any{"@odata.id": task1}}) {
		t.Errorf("Tasks members %v, want the one task", members)
	}
}

// messageIDsOf joins the MessageIds of a Task's Messages.
func messageIDsOf(messages any) string {
	list, _ := messages.([]any)
	return strings.Join(extendedIDs(map[string]any{"@Message.ExtendedInfo": list}), ",")
}

// TestTaskEnds: a failed import ends its task in Exception with the
// reason, an eject before the import is done cancels it, and each
// monitor then answers the error.
func TestTaskEnds(t *testing.T) {
	tests := []struct {
		name        string
		end         func(f *fixture)
		wantState   string
		wantStatus  int // the monitor's
		wantMessage string
		wantReason  string // in the message's Resolution
	}{
		{"import fails", func(f *fixture) {
			if !f.backend.Get("vm-0").FailMediaImport("HTTP 404 from images.example") {
				f.t.Fatal("no import under way")
			}
		}, "Exception", 500, "TaskEvent.1.0.TaskAborted", "HTTP 404 from images.example"},
		{"media ejected", func(f *fixture) { f.do(asAdmin("POST", sysEject0, "")) }, "Cancelled", 409, "TaskEvent.1.0.TaskCancelled", "ejected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, nil)
			slowMedia(f)
			if res := f.do(asAdmin("POST", sysInsert0, `{"Image":"`+image+`"}`)); res.status != 202 {
				t.Fatalf("insert: %d %s", res.status, res.raw)
			}
			tt.end(f)
			res := f.do(asAdmin("GET", taskMonitor1, ""))
			if res.status != tt.wantStatus || !slices.Equal(messageIDs(t, res), []string{tt.wantMessage}) {
				t.Fatalf("monitor: %d %s, want %d with %s", res.status, res.raw, tt.wantStatus, tt.wantMessage)
			}
			task := f.do(asAdmin("GET", task1, "")).json
			resolution, _ := lookup(task, "Messages").([]any)[0].(map[string]any)["Resolution"].(string)
			if task["TaskState"] != tt.wantState || task["EndTime"] == nil || !strings.Contains(resolution, tt.wantReason) {
				t.Errorf("task %v, want %s with an EndTime and %q in the Resolution", task, tt.wantState, tt.wantReason)
			}
			// A finished task stays finished, whatever the drive does next.
			f.do(asAdmin("POST", sysEject0, ""))
			f.do(asAdmin("POST", sysInsert0, `{"Image":"`+image+`"}`))
			if again := f.do(asAdmin("GET", task1, "")).json; again["TaskState"] != tt.wantState {
				t.Errorf("after another insert the finished task reads %v", again["TaskState"])
			}
		})
	}
}

// TestTasksBoundedAndExpired: finished tasks go after their expiry, and
// the store never holds more than its bound however many inserts come.
func TestTasksBoundedAndExpired(t *testing.T) {
	f := newFixture(t, nil)
	slowMedia(f)
	for i := range 40 {
		if res := f.do(asAdmin("POST", sysInsert0, fmt.Sprintf(`{"Image":"http://images.example/%d.iso"}`, i))); res.status != 202 {
			t.Fatalf("insert %d: %d %s", i, res.status, res.raw)
		}
		f.do(asAdmin("POST", sysEject0, ""))
	}
	tasks := f.do(asAdmin("GET", "/redfish/v1/TaskService/Tasks", "")).json
	if n := tasks["Members@odata.count"]; n != float64(32) {
		t.Fatalf("%v tasks kept, want 32", n)
	}
	if first := lookup(tasks, "Members").([]any)[0]; lookup(first.(map[string]any), "@odata.id") != "/redfish/v1/TaskService/Tasks/9" {
		t.Errorf("oldest task kept %v, want 9: the oldest make room", first)
	}
	// Finished tasks are read, and so end, when listed or fetched.
	for i := 9; i <= 40; i++ {
		f.do(asAdmin("GET", fmt.Sprintf("/redfish/v1/TaskService/Tasks/%d", i), ""))
	}
	f.clock.Advance(10 * time.Minute)
	if res := f.do(asAdmin("GET", "/redfish/v1/TaskService/Tasks/40", "")); res.status != 404 {
		t.Errorf("an expired task: %d, want 404", res.status)
	}
	if n := f.do(asAdmin("GET", "/redfish/v1/TaskService/Tasks", "")).json["Members@odata.count"]; n != float64(0) {
		t.Errorf("%v tasks after the expiry, want 0", n)
	}
}

// TestTasksArePerServer: the shared bmc-server has a Server per VM; a
// task of one is not found through another, on the same backend.
func TestTasksArePerServer(t *testing.T) {
	f := newFixture(t, nil)
	slowMedia(f)
	other, err := redfish.NewServer(redfish.Config{
		Backend:  f.backend,
		Accounts: []redfish.Account{{Username: adminUser, Password: adminPass, Role: redfish.RoleAdministrator}},
		Now:      f.clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res := f.do(asAdmin("POST", sysInsert0, `{"Image":"`+image+`"}`)); res.status != 202 {
		t.Fatalf("insert: %d %s", res.status, res.raw)
	}
	g := &fixture{t: t, server: other, backend: f.backend, clock: f.clock}
	for _, path := range []string{task1, taskMonitor1} {
		if res := g.do(asAdmin("GET", path, "")); res.status != 404 {
			t.Errorf("another server's %s: %d, want 404", path, res.status)
		}
	}
	if n := g.do(asAdmin("GET", "/redfish/v1/TaskService/Tasks", "")).json["Members@odata.count"]; n != float64(0) {
		t.Errorf("another server lists %v tasks, want 0", n)
	}
}

// TestActionInfo: the ActionInfo of Reset offers the machine's reset
// types, and InsertMedia's the parameters the action accepts.
func TestActionInfo(t *testing.T) {
	f := newFixture(t, nil)
	system := f.do(asAdmin("GET", system0, "")).json
	cd := f.do(asAdmin("GET", sysCD0, "")).json
	tests := []struct {
		annotation any
		path       string
		wantParams string
	}{
		{lookup(system, "Actions", "#ComputerSystem.Reset", "@Redfish.ActionInfo"), system0 + "/ResetActionInfo", "ResetType"},
		{lookup(cd, "Actions", "#VirtualMedia.InsertMedia", "@Redfish.ActionInfo"), sysCD0 + "/InsertMediaActionInfo", "Image Inserted WriteProtected TransferProtocolType TransferMethod"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			if tt.annotation != tt.path {
				t.Errorf("@Redfish.ActionInfo %v, want %s", tt.annotation, tt.path)
			}
			res := f.do(asAdmin("GET", tt.path, ""))
			if res.status != 200 {
				t.Fatalf("%d %s", res.status, res.raw)
			}
			var names []string
			for _, p := range res.json["Parameters"].([]any) {
				names = append(names, p.(map[string]any)["Name"].(string))
			}
			if got := strings.Join(names, " "); got != tt.wantParams {
				t.Errorf("parameters %q, want %q", got, tt.wantParams)
			}
		})
	}
}
