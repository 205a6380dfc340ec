package redfish

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/virtmetal/virtmetal/machine"
)

// The TaskService follows the actions that finish after they answer: an
// InsertMedia whose image the backend is still fetching answers 202 with a
// Task, and its task monitor (the 202's Location) answers 202 until the
// drive reads the image, then what the action would have answered. Tasks
// live in the process, per Server: a shared bmc-server has a Server per
// VM, so one VM's tasks are never listed by another's service.
const (
	taskServicePath = "/redfish/v1/TaskService"
	tasksPath       = taskServicePath + "/Tasks"
	taskMonitorsDir = taskServicePath + "/TaskMonitors"
	// maxTasks bounds the tasks kept; the oldest finished one makes room.
	maxTasks = 32
	// taskExpiry is how long a finished task stays readable
	// (TaskAutoDeleteTimeoutMinutes).
	taskExpiry = 10 * time.Minute
)

func taskPath(id string) string        { return tasksPath + "/" + id }
func taskMonitorPath(id string) string { return taskMonitorsDir + "/" + id }

// Task states this service reports (TaskState).
const (
	taskPending   = "Pending"
	taskRunning   = "Running"
	taskCompleted = "Completed"
	taskException = "Exception"
	taskCancelled = "Cancelled"
)

// mediaTask is an InsertMedia that answered before its image was ready.
type mediaTask struct {
	id        string
	machineID string
	image     string
	start     time.Time
	// What the media read last: state is one of the task states above;
	// end is set once that state is final, and nothing is read again.
	state   string
	percent int
	problem string
	end     time.Time
}

func (t *mediaTask) finished() bool { return !t.end.IsZero() }

// taskStore holds a Server's tasks, oldest first.
type taskStore struct {
	mu     sync.Mutex
	lastID int
	tasks  []*mediaTask
}

// expire drops the finished tasks older than taskExpiry. Callers hold mu.
func (ts *taskStore) expire(now time.Time) {
	ts.tasks = slices.DeleteFunc(ts.tasks, func(t *mediaTask) bool {
		return t.finished() && now.Sub(t.end) >= taskExpiry
	})
}

// start returns the task of an insert of image into the machine: the one
// under way for the same image (a client's retry), or a new one.
func (ts *taskStore) start(now time.Time, machineID, image string) mediaTask {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.expire(now)
	for _, t := range ts.tasks {
		if t.machineID == machineID && t.image == image && !t.finished() {
			return *t
		}
	}
	if len(ts.tasks) == maxTasks {
		i := slices.IndexFunc(ts.tasks, (*mediaTask).finished)
		ts.tasks = slices.Delete(ts.tasks, max(i, 0), max(i, 0)+1)
	}
	ts.lastID++
	t := &mediaTask{id: strconv.Itoa(ts.lastID), machineID: machineID, image: image, start: now, state: taskRunning}
	ts.tasks = append(ts.tasks, t)
	return *t
}

// get returns a copy of the task with that ID.
func (ts *taskStore) get(now time.Time, id string) (mediaTask, bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.expire(now)
	for _, t := range ts.tasks {
		if t.id == id {
			return *t, true
		}
	}
	return mediaTask{}, false
}

// ids lists the tasks' IDs, oldest first.
func (ts *taskStore) ids(now time.Time) []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.expire(now)
	ids := make([]string, len(ts.tasks))
	for i, t := range ts.tasks {
		ids[i] = t.id
	}
	return ids
}

// record keeps what a read of the media found for a task still kept.
func (ts *taskStore) record(read mediaTask) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, t := range ts.tasks {
		if t.id == read.id && !t.finished() {
			*t = read
		}
	}
}

// followTask reads the machine's media and returns the task as it stands
// now; a finished task is not read again.
func (s *Server) followTask(ctx context.Context, t mediaTask) (mediaTask, error) {
	if t.finished() {
		return t, nil
	}
	media, err := s.readMedia(ctx, t.machineID)
	if err != nil {
		return t, s.mapBackendError(err, operation{resourceType: "Task", resourceID: t.id})
	}
	switch {
	case !media.Inserted || media.Image != t.image:
		t.state, t.problem = taskCancelled, "The media was ejected or replaced before its image was ready."
	case media.State == machine.MediaReady:
		t.state, t.percent = taskCompleted, 100
	case media.State == machine.MediaFailed:
		t.state, t.percent, t.problem = taskException, media.Percent, "The image could not be imported: "+media.Problem+
			". Eject the media, check that the URL can be fetched, and insert it again."
	case media.State == machine.MediaPending:
		t.state, t.percent = taskPending, media.Percent
	default:
		t.state, t.percent = taskRunning, media.Percent
	}
	if t.state != taskPending && t.state != taskRunning {
		t.end = s.now()
	}
	s.tasks.record(t)
	return t, nil
}

// readMedia reads a machine's drive; a machine that is gone has none.
func (s *Server) readMedia(ctx context.Context, id string) (machine.VirtualMedia, error) {
	m, err := s.backend.Machine(ctx, id)
	if errors.Is(err, machine.ErrNotFound) {
		return machine.VirtualMedia{}, nil
	}
	if err != nil {
		return machine.VirtualMedia{}, err
	}
	return m.VirtualMedia(ctx)
}

// taskBody renders a Task.
func taskBody(t mediaTask) map[string]any {
	body := resource(typeTask, taskPath(t.id), t.id, "Insert media into "+t.machineID)
	body["TaskState"] = t.state
	body["PercentComplete"] = t.percent
	body["StartTime"] = t.start.UTC().Format(time.RFC3339)
	body["TaskMonitor"] = taskMonitorPath(t.id)
	body["Payload"] = map[string]any{"HttpOperation": http.MethodPost, "TargetUri": cdPath(t.machineID) + "/Actions/VirtualMedia.InsertMedia"}
	status, messages := "OK", []any{}
	switch t.state {
	case taskRunning:
		messages = append(messages, message{key: msgTaskStarted, args: []string{t.id}}.body())
	case taskCompleted:
		messages = append(messages, message{key: msgTaskCompletedOK, args: []string{t.id}}.body())
	case taskException:
		status = "Critical"
		messages = append(messages, taskEnd(t).body())
	case taskCancelled:
		status = "Warning"
		messages = append(messages, taskEnd(t).body())
	}
	body["TaskStatus"] = status
	body["Messages"] = messages
	if t.finished() {
		body["EndTime"] = t.end.UTC().Format(time.RFC3339)
	}
	return body
}

// taskEnd is the message of a task that did not complete.
func taskEnd(t mediaTask) message {
	key := msgTaskAborted
	if t.state == taskCancelled {
		key = msgTaskCancelled
	}
	return message{key: key, args: []string{t.id}, resolution: t.problem}
}

// accepted is the 202 of an action that goes on as task t.
func (s *Server) accepted(t mediaTask) result {
	return result{
		status: http.StatusAccepted,
		body:   taskBody(t),
		header: http.Header{"Location": {taskMonitorPath(t.id)}, "Retry-After": {strconv.Itoa(int(s.retryAfter / time.Second))}},
	}
}

func (s *Server) getTaskService(*call) (result, error) {
	body := resource(typeTaskService, taskServicePath, "TaskService", "Task Service")
	body["ServiceEnabled"] = true
	body["Status"] = statusOK()
	body["CompletedTaskOverWritePolicy"] = "Oldest"
	body["LifeCycleEventOnTaskStateChange"] = false
	body["TaskAutoDeleteTimeoutMinutes"] = int(taskExpiry / time.Minute)
	body["Tasks"] = link(tasksPath)
	return result{body: body}, nil
}

func (s *Server) getTasks(*call) (result, error) {
	ids := s.tasks.ids(s.now())
	members := make([]string, len(ids))
	for i, id := range ids {
		members[i] = taskPath(id)
	}
	return result{body: collection(typeTaskCollection, tasksPath, "Task Collection", members)}, nil
}

// taskOf resolves the path's task and reads where it stands.
func (s *Server) taskOf(c *call) (mediaTask, error) {
	id := c.vars["taskID"]
	t, ok := s.tasks.get(s.now(), id)
	if !ok {
		return mediaTask{}, newError(http.StatusNotFound, msgResourceNotFound, "Task", id)
	}
	return s.followTask(c.ctx(), t)
}

func (s *Server) getTask(c *call) (result, error) {
	t, err := s.taskOf(c)
	if err != nil {
		return result{}, err
	}
	return result{body: taskBody(t)}, nil
}

// getTaskMonitor answers 202 while the task runs, then what the action
// would have answered had it waited: 204 once the image is ready, an
// error when the import failed or the media went away first.
func (s *Server) getTaskMonitor(c *call) (result, error) {
	t, err := s.taskOf(c)
	if err != nil {
		return result{}, err
	}
	switch t.state {
	case taskCompleted:
		return result{}, nil
	case taskException:
		return result{}, &apiError{status: http.StatusInternalServerError, messages: []message{taskEnd(t)}}
	case taskCancelled:
		return result{}, &apiError{status: http.StatusConflict, messages: []message{taskEnd(t)}}
	}
	return s.accepted(t), nil
}
